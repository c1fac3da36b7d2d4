namespace loom {}
