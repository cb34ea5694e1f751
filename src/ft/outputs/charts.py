"""PNG line charts of logged values against the optimizer step (``plots/`` of a run, ``ft report --plots``).

Drawn with Pillow: an axes box with "nice" ticks and a light grid, one coloured line per series (with dots while a
line has few points), axis labels and, for several series, a legend in the emptiest corner. That is all ft's plots
need, and it is ready in a fraction of the time importing matplotlib alone took in every ``ft train`` (the plots are
drawn when training ends, before the command returns: benchmarks/README.md has both). Everything is drawn at twice
the size and scaled down, which smooths lines and text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 600, 350  # pixels of the written PNG
SCALE = 2  # drawn at SCALE times the size, then scaled down
FONT_PX = 13  # about matplotlib's 10 pt at 100 dpi
MARKERS_BELOW = 30  # a line with fewer points gets a dot at each
# matplotlib's default colour cycle ("tab10"), so the charts look as they did when ft drew them with it
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")
GRID, FRAME, TEXT = "#e6e6e6", "#000000", "#000000"
LINE, DOT = 2, 2.5  # line width and dot radius, in pixels of the written PNG

Points = Sequence[tuple[float, float]]


def line_chart(path: Path, lines: Sequence[tuple[str, Points]], ylabel: str, *, legend: bool = True,
               xlabel: str = "step") -> None:
    """``path`` (a PNG): each ``(label, points)`` of ``lines`` one line of ``(x, y)`` points, in order."""
    lines = [(label, list(points)) for label, points in lines if points]
    s = SCALE
    image = Image.new("RGB", (WIDTH * s, HEIGHT * s), "white")
    draw = ImageDraw.Draw(image)
    font = _font(FONT_PX * s)
    xs = [x for _, points in lines for x, _ in points] or [0.0, 1.0]
    ys = [y for _, points in lines for _, y in points] or [0.0, 1.0]
    (x_low, x_high), (y_low, y_high) = _limits(min(xs), max(xs)), _limits(min(ys), max(ys))
    x_ticks, y_ticks = _ticks(x_low, x_high), _ticks(y_low, y_high)
    x_text, y_text = _tick_labels(x_ticks), _tick_labels(y_ticks)

    tick, pad, line_height = 4 * s, 4 * s, _text_size(draw, "0", font)[1]
    label_width = max(_text_size(draw, text, font)[0] for text in y_text)
    left = pad * 2 + line_height + pad + label_width + tick
    bottom = HEIGHT * s - (pad * 2 + line_height * 2 + pad + tick)
    right, top = WIDTH * s - 12 * s, 10 * s

    def px(x: float) -> float:
        return left + (x - x_low) / (x_high - x_low) * (right - left)

    def py(y: float) -> float:
        return bottom - (y - y_low) / (y_high - y_low) * (bottom - top)

    for value, text in zip(x_ticks, x_text, strict=True):
        x = px(value)
        draw.line([(x, top), (x, bottom)], fill=GRID, width=s)
        draw.line([(x, bottom), (x, bottom + tick)], fill=FRAME, width=s)
        width = _text_size(draw, text, font)[0]
        draw.text((x - width / 2, bottom + tick + pad), text, fill=TEXT, font=font)
    for value, text in zip(y_ticks, y_text, strict=True):
        y = py(value)
        draw.line([(left, y), (right, y)], fill=GRID, width=s)
        draw.line([(left - tick, y), (left, y)], fill=FRAME, width=s)
        width = _text_size(draw, text, font)[0]
        draw.text((left - tick - pad - width, y - line_height / 2), text, fill=TEXT, font=font, anchor="la")
    draw.rectangle([left, top, right, bottom], outline=FRAME, width=s)

    for index, (_, points) in enumerate(lines):
        color = COLORS[index % len(COLORS)]
        coords = [(px(x), py(y)) for x, y in points]
        if len(coords) > 1:
            draw.line(coords, fill=color, width=LINE * s, joint="curve")
        if len(coords) < MARKERS_BELOW:
            for x, y in coords:
                _dot(draw, x, y, color)

    xlabel_width = _text_size(draw, xlabel, font)[0]
    draw.text(((left + right) / 2 - xlabel_width / 2, bottom + tick + pad + line_height + pad), xlabel, fill=TEXT,
              font=font)
    _vertical_text(image, ylabel, font, x=pad * 2, center_y=(top + bottom) / 2)
    if legend and lines:
        _legend(draw, font, [(label, len(points) < MARKERS_BELOW) for label, points in lines],
                [(px(x), py(y)) for _, points in lines for x, y in points], (left, top, right, bottom))
    image.resize((WIDTH, HEIGHT), Image.Resampling.LANCZOS).save(path, format="PNG")


def _limits(low: float, high: float) -> tuple[float, float]:
    """The axis range: the data's with 5% room each side (matplotlib's margins); a flat series gets room too."""
    span = high - low
    if span <= 0:
        span = abs(high) * 0.1 or 1.0
        return low - span / 2, high + span / 2
    return low - span * 0.05, high + span * 0.05


def _ticks(low: float, high: float, most: int = 7) -> list[float]:
    """Round values inside ``[low, high]``: multiples of 1, 2, 2.5 or 5 times a power of ten, at most ``most``."""
    raw = (high - low) / (most - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9)
    ticks = [(first + i) * step for i in range(most + 1)]
    return [0.0 if abs(t) < step * 1e-9 else t for t in ticks if t <= high + step * 1e-9]


def _tick_labels(ticks: list[float]) -> list[str]:
    """As few digits as tell the ticks apart; powers of ten (1.5e-04) for very small or large values."""
    biggest = max(abs(t) for t in ticks)
    scientific = biggest != 0 and (biggest < 1e-3 or biggest >= 1e6)
    for digits in range(0, 10):
        texts = [f"{t:.{digits}e}" if scientific else f"{t:.{digits}f}" for t in ticks]
        if all(math.isclose(float(text), t, rel_tol=1e-6, abs_tol=1e-12) for text, t in zip(texts, ticks,
                                                                                           strict=True)):
            return texts
    return texts


def _legend(draw: ImageDraw.ImageDraw, font, entries: list[tuple[str, bool]], points: list[tuple[float, float]],
            box: tuple[float, float, float, float]) -> None:
    """A framed key in the corner covering fewest ``points``: per ``(label, dotted)`` entry a sample of the series'
    line (with a dot when its line has them) and the label."""
    labels = [label for label, _ in entries]
    s, (left, top, right, bottom) = SCALE, box
    line_height = _text_size(draw, "0", font)[1]
    sample, gap, inner = 20 * s, 6 * s, 6 * s
    width = inner * 2 + sample + gap + max(_text_size(draw, label, font)[0] for label in labels)
    height = inner * 2 + len(labels) * line_height + (len(labels) - 1) * 4 * s
    margin = 8 * s
    corners = [(right - margin - width, top + margin), (left + margin, top + margin),
               (right - margin - width, bottom - margin - height), (left + margin, bottom - margin - height)]

    def covered(corner: tuple[float, float]) -> int:
        x, y = corner
        return sum(x <= px <= x + width and y <= py <= y + height for px, py in points)

    x, y = min(corners, key=covered)
    draw.rounded_rectangle([x, y, x + width, y + height], radius=3 * s, fill="white", outline="#cccccc", width=s)
    for index, (label, dotted) in enumerate(entries):
        row, color = y + inner + index * (line_height + 4 * s), COLORS[index % len(COLORS)]
        middle = row + line_height / 2
        draw.line([(x + inner, middle), (x + inner + sample, middle)], fill=color, width=LINE * s)
        if dotted:
            _dot(draw, x + inner + sample / 2, middle, color)
        draw.text((x + inner + sample + gap, row), label, fill=TEXT, font=font)


def _dot(draw: ImageDraw.ImageDraw, x: float, y: float, color: str) -> None:
    r = DOT * SCALE
    draw.ellipse([x - r, y - r, x + r, y + r], fill=color)


def _vertical_text(image: Image.Image, text: str, font, *, x: float, center_y: float) -> None:
    """``text`` turned a quarter to the left (reading upwards), its top edge at ``x``, centred on ``center_y``."""
    probe = ImageDraw.Draw(image)
    width, height = _text_size(probe, text, font)
    strip = Image.new("L", (int(width) + 2, int(height) + 4), 0)
    ImageDraw.Draw(strip).text((1, 0), text, fill=255, font=font)
    turned = strip.rotate(90, expand=True)
    image.paste(Image.new("RGB", turned.size, TEXT), (int(x), int(center_y - turned.size[1] / 2)), turned)


def _text_size(draw: ImageDraw.ImageDraw, text: str, font) -> tuple[float, float]:
    """(width, height) of ``text``; the height is the font's line height (ascent + descent), the same for any text."""
    ascent, descent = font.getmetrics()
    return draw.textlength(text, font=font), ascent + descent


@cache
def _font(size: int):
    """Pillow's bundled scalable font (FreeType; the release pyproject.toml requires), else its small bitmap one."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, AttributeError, OSError):  # Pillow < 10.1, or built without FreeType
        return ImageFont.load_default()
