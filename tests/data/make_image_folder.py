#!/usr/bin/env python3
"""Writes an image-folder tree (torchvision's ImageFolder layout) with PIL
(Debian's python3-pil) and, beside it, what PIL and torchvision's rules make
of it, computed with plain Python (no torchvision needed):

  OUT/tree/<class>/...       JPEG and PNG files (RGB, L, RGBA, P; nested
                             directories; upper-case extensions; a .txt that
                             ImageFolder ignores)
  OUT/expected/classes.txt   class names in torchvision's order (sorted)
  OUT/expected/samples.txt   "label<TAB>path relative to tree" in ImageFolder's order
  OUT/expected/N.rgb, N.l    sample N as Image.open(path).convert("RGB") / ("L") bytes
  OUT/expected/N.resized     convert("RGB"), Resize(SIZE) on the shorter side with
                             BILINEAR (int(SIZE * long / short) for the other
                             side), then CenterCrop(SIZE) as torchvision
                             computes its window (round((side - SIZE) / 2))

  make_image_folder.py OUT [--size SIZE]
"""
import argparse
import os
import random

from PIL import Image

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def picture(width, height, seed, mode):
    """A smooth gradient with a few shapes (JPEG-friendly), in `mode`."""
    rng = random.Random(seed)
    image = Image.new("RGB", (width, height))
    a, b, c = rng.randrange(256), rng.randrange(256), rng.randrange(256)
    pixels = [((a + 3 * x) % 256, (b + 2 * y) % 256, (c + x + y) % 256) for y in range(height) for x in range(width)]
    image.putdata(pixels)
    for _ in range(3):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        for y in range(y0, min(height, y0 + height // 3)):
            for x in range(x0, min(width, x0 + width // 3)):
                image.putpixel((x, y), colour)
    if mode == "RGBA":
        image = image.convert("RGBA")
        image.putalpha(Image.new("L", (width, height), 90))
        return image
    return image.convert(mode)


# (class directory, relative file path, width, height, mode, format)
FILES = [
    ("b_cat", "c.jpg", 40, 30, "RGB", "JPEG"),
    ("b_cat", "a.PNG", 33, 47, "RGB", "PNG"),
    ("b_cat", "sub/z.jpeg", 64, 64, "RGB", "JPEG"),
    ("b_cat", "B.png", 25, 25, "L", "PNG"),
    ("A_dog", "one.JPG", 50, 37, "L", "JPEG"),
    ("A_dog", "two.png", 31, 29, "RGBA", "PNG"),
    ("a_bird", "p.png", 45, 28, "P", "PNG"),
    ("a_bird", "x/y/deep.jpg", 28, 45, "RGB", "JPEG"),
    ("a_bird", "x/q.jpg", 24, 24, "RGB", "JPEG"),
    ("zebra10", "1.png", 20, 60, "RGB", "PNG"),
    ("zebra9", "1.jpg", 70, 21, "RGB", "JPEG"),
]


def torchvision_samples(root):
    """datasets.folder.find_classes + make_dataset, restated."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    samples = []
    for label, name in enumerate(classes):
        for directory, _, names in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            for file_name in sorted(names):
                if file_name.lower().endswith(IMG_EXTENSIONS):
                    samples.append((label, os.path.relpath(os.path.join(directory, file_name), root)))
    return classes, samples


def resize_center_crop(image, size):
    width, height = image.size
    short, long = min(width, height), max(width, height)
    new_long = int(size * long / short)
    new_width, new_height = (size, new_long) if width <= height else (new_long, size)
    if short != size:
        image = image.resize((new_width, new_height), Image.BILINEAR)
    top = int(round((new_height - size) / 2.0))
    left = int(round((new_width - size) / 2.0))
    return image.crop((left, top, left + size, top + size))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--size", type=int, default=24)
    args = parser.parse_args()
    tree = os.path.join(args.out, "tree")
    expected = os.path.join(args.out, "expected")
    os.makedirs(expected, exist_ok=True)
    for seed, (klass, relative, width, height, mode, kind) in enumerate(FILES):
        path = os.path.join(tree, klass, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        options = {"quality": 90} if kind == "JPEG" else {}
        picture(width, height, seed, mode).save(path, kind, **options)
    with open(os.path.join(tree, "b_cat", "notes.txt"), "w") as notes:
        notes.write("not an image\n")
    classes, samples = torchvision_samples(tree)
    with open(os.path.join(expected, "classes.txt"), "w") as out:
        out.write("".join(name + "\n" for name in classes))
    with open(os.path.join(expected, "samples.txt"), "w") as out:
        out.write("".join("%d\t%s\n" % sample for sample in samples))
    for n, (_, relative) in enumerate(samples):
        with Image.open(os.path.join(tree, relative)) as image:
            rgb = image.convert("RGB")
            with open(os.path.join(expected, "%d.rgb" % n), "wb") as out:
                out.write(rgb.tobytes())
            with open(os.path.join(expected, "%d.l" % n), "wb") as out:
                out.write(image.convert("L").tobytes())
            with open(os.path.join(expected, "%d.resized" % n), "wb") as out:
                out.write(resize_center_crop(rgb, args.size).tobytes())


if __name__ == "__main__":
    main()
