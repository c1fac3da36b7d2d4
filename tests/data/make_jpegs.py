#!/usr/bin/env python3
"""Writes an image folder of larger JPEGs (and a PNG) with PIL, for the
partial-decode and fused RandomResizedCrop tests: every chroma subsampling
PIL writes (4:2:0, 4:2:2, 4:4:4), grayscale, progressive, restart markers,
sizes that are not multiples of the MCU, and an image smaller than the crop;
and two blank 3000x3000 JPEGs, as small as PIL can make them (about 2 bits
per 8x8 block), for the check that a file can hold the blocks it declares.

  make_jpegs.py OUT      writes OUT/tree/<class>/<name> and OUT/blank/<name>
"""
import os
import random
import sys

from PIL import Image, ImageDraw


def picture(width, height, seed):
    rng = random.Random(seed)
    image = Image.new("RGB", (width, height), (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    draw = ImageDraw.Draw(image)
    for _ in range(25):
        x, y = rng.randrange(width), rng.randrange(height)
        draw.ellipse((x, y, x + rng.randrange(5, 120), y + rng.randrange(5, 120)),
                     fill=(rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    for _ in range(200):  # single-pixel detail, so that chroma context matters at every edge
        image.putpixel((rng.randrange(width), rng.randrange(height)),
                       (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    return image


# (class, name, width, height, save options)
FILES = [
    ("a", "s420.jpg", 500, 375, {"quality": 90}),
    ("a", "s444.jpg", 375, 500, {"quality": 90, "subsampling": 0}),
    ("a", "s422.jpg", 301, 227, {"quality": 85, "subsampling": 1}),
    ("b", "gray.jpg", 257, 199, {"quality": 90, "mode": "L"}),
    ("b", "progressive.jpg", 333, 250, {"quality": 80, "progressive": True}),
    ("b", "restart.jpg", 250, 333, {"quality": 75, "restart_marker_blocks": 3}),
    ("c", "small.jpg", 97, 131, {"quality": 95}),
    ("c", "odd.jpg", 223, 17, {"quality": 90}),
    ("c", "picture.png", 300, 200, {}),
]


def main():
    out = sys.argv[1]
    for seed, (klass, name, width, height, options) in enumerate(FILES):
        os.makedirs(os.path.join(out, "tree", klass), exist_ok=True)
        options = dict(options)
        image = picture(width, height, seed).convert(options.pop("mode", "RGB"))
        image.save(os.path.join(out, "tree", klass, name), **options)
    os.makedirs(os.path.join(out, "blank"), exist_ok=True)
    blank = Image.new("RGB", (3000, 3000), (128, 128, 128))
    blank.save(os.path.join(out, "blank", "progressive.jpg"), quality=1, progressive=True)
    blank.save(os.path.join(out, "blank", "optimized.jpg"), quality=1, optimize=True)


if __name__ == "__main__":
    main()
