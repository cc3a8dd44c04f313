"""unimodal.core.figures: a figure is written whole or not at all, in the format its path names, and closed."""

import pytest

from unimodal.core.figures import pyplot, save_figure


def _figure():
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(2, 2))
    axis.plot([0, 1], [1, 0])
    return plt, figure


def test_a_figure_is_written_in_its_suffix_format_and_closed(tmp_path):
    plt, figure = _figure()
    png = save_figure(figure, tmp_path / "curve.png", dpi=50)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(figure.number)
    plt, figure = _figure()
    svg = save_figure(figure, tmp_path / "curve.svg")
    assert b"<svg" in svg.read_bytes()[:2000]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curve.png", "curve.svg"]  # no temporary left


def test_a_failed_write_keeps_the_last_whole_figure(tmp_path, monkeypatch):
    plt, figure = _figure()
    path = save_figure(figure, tmp_path / "curve.png", dpi=50)
    before = path.read_bytes()
    plt, figure = _figure()

    def broken(*args, **kwargs):
        with open(args[0], "wb") as f:
            f.write(b"half a png")
        raise OSError("disk full")

    monkeypatch.setattr(figure, "savefig", broken)
    with pytest.raises(OSError, match="disk full"):
        save_figure(figure, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]
    assert not plt.fignum_exists(figure.number)  # closed even when the write failed
