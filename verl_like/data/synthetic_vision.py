"""The embedded image task `synthetic:count`: how many squares are drawn in a small picture (Pillow, no files).

A question is a layout: 1 to 4 of the 9 cells of a 3 x 3 grid, each holding a filled square of random size (8 to 12 pixels),
offset and pale colour on a black 48 x 48 image. The layout's text (`count 0:5,3,... ` cells, sizes, offsets, colours) is what
synthetic.py hashes into the held-out pool, so the test split's pictures are never trained on. The prompt is one
user message `<image>how many squares?`; the answer is the count as one digit. The flawed demonstrator counts one
square too many.
"""

from __future__ import annotations

import io
import random

IMAGE_SIDE = 48
GRID = 3
CELL = IMAGE_SIDE // GRID
PROMPT_TEXT = "<image>how many squares?"
_COLOURS = ((255, 255, 255), (255, 255, 160), (160, 255, 255))


def make_count(rng: random.Random) -> tuple[str, str, str]:
    """(layout key, count, count + 1) of a random picture."""
    count = rng.randint(1, 4)
    cells = sorted(rng.sample(range(GRID * GRID), count))
    parts = []
    for cell in cells:
        side = rng.randint(8, 12)
        dx, dy = rng.randint(0, CELL - side), rng.randint(0, CELL - side)
        parts.append(f"{cell}:{side}:{dx}:{dy}:{rng.randrange(len(_COLOURS))}")
    return "count " + ",".join(parts), str(count), str(count + 1)


def render_count(question: str) -> bytes:
    """The PNG bytes of the picture a `make_count` layout key describes."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE))
    draw = ImageDraw.Draw(image)
    for part in question.split(" ", 1)[1].split(","):
        cell, side, dx, dy, colour = (int(v) for v in part.split(":"))
        x0, y0 = (cell % GRID) * CELL + dx, (cell // GRID) * CELL + dy
        draw.rectangle([x0, y0, x0 + side - 1, y0 + side - 1], fill=_COLOURS[colour])
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
