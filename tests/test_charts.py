"""ft.outputs.charts: the PNG line charts of plots/ and `ft report --plots` show the data where it is."""

from __future__ import annotations

import pytest
from PIL import Image

from ft.outputs import charts

BLUE, ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)  # the first two series' colours


def _pixels_of(image: Image.Image, color: tuple[int, int, int], tolerance: int = 40) -> list[tuple[int, int]]:
    rgb = image.convert("RGB")
    width, height = rgb.size
    data = rgb.load()
    return [(x, y) for x in range(width) for y in range(height)
            if all(abs(a - b) <= tolerance for a, b in zip(data[x, y], color, strict=True))]


def test_a_rising_series_is_drawn_rising_and_a_falling_one_falling(tmp_path):
    rising = [(step, step / 100) for step in range(0, 1001, 10)]
    falling = [(step, 10 - step / 100) for step in range(0, 1001, 10)]
    charts.line_chart(tmp_path / "up.png", [("up", rising)], "value", legend=False)
    charts.line_chart(tmp_path / "down.png", [("down", falling)], "value", legend=False)
    for name, goes_up in (("up.png", True), ("down.png", False)):
        image = Image.open(tmp_path / name)
        assert image.size == (charts.WIDTH, charts.HEIGHT)
        line = _pixels_of(image, BLUE)
        assert len(line) > 400  # a line across the chart, not a speck
        xs = sorted(x for x, _ in line)
        left = [y for x, y in line if x < xs[len(xs) // 4]]
        right = [y for x, y in line if x > xs[3 * len(xs) // 4]]
        mean_left, mean_right = sum(left) / len(left), sum(right) / len(right)
        # image rows grow downwards: a rising line sits lower (larger y) on the left
        assert (mean_left > mean_right + 100) if goes_up else (mean_right > mean_left + 100), name
        assert xs[-1] - xs[0] > charts.WIDTH * 0.7  # it spans the plot's width


def test_each_series_gets_its_own_colour_and_few_points_get_dots(tmp_path):
    charts.line_chart(tmp_path / "two.png", [("train", [(10, 3.0), (20, 2.0), (30, 1.5)]),
                                             ("eval", [(10, 3.2), (30, 2.1)])], "loss")
    image = Image.open(tmp_path / "two.png")
    assert len(_pixels_of(image, BLUE)) > 100 and len(_pixels_of(image, ORANGE)) > 100
    charts.line_chart(tmp_path / "dots.png", [("one point", [(5, 1.0)])], "value", legend=False)
    assert len(_pixels_of(Image.open(tmp_path / "dots.png"), BLUE)) > 10  # a lone point is a visible dot


def test_empty_and_flat_series_still_draw_axes(tmp_path):
    charts.line_chart(tmp_path / "flat.png", [("flat", [(step, 0.5) for step in range(10)])], "value")
    charts.line_chart(tmp_path / "none.png", [("nothing", [])], "value")
    assert len(_pixels_of(Image.open(tmp_path / "flat.png"), BLUE)) > 200
    assert Image.open(tmp_path / "none.png").size == (charts.WIDTH, charts.HEIGHT)


@pytest.mark.parametrize(("low", "high", "ticks"), [
    (0, 1040, [0, 200, 400, 600, 800, 1000]),
    (1.9, 4.05, [2.0, 2.5, 3.0, 3.5, 4.0]),
    (-0.3, 0.3, [-0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3]),
])
def test_ticks_are_round_values_inside_the_range(low, high, ticks):
    assert charts._ticks(low, high) == pytest.approx(ticks)


@pytest.mark.parametrize(("ticks", "labels"), [
    ([0, 200, 400], ["0", "200", "400"]),
    ([2.0, 2.5, 3.0], ["2.0", "2.5", "3.0"]),
    ([0.0, 0.0002, 0.0004], ["0e+00", "2e-04", "4e-04"]),
    ([0.25, 0.5, 0.75], ["0.25", "0.50", "0.75"]),
])
def test_tick_labels_use_as_few_digits_as_tell_them_apart(ticks, labels):
    assert charts._tick_labels(ticks) == labels
