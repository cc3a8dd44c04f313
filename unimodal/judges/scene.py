"""SceneJudge: finds the coloured shapes of a scene with OpenCV and reads them back as grammar attributes
(shape, colour, size, position or relation), comparable with :func:`unimodal.core.grammar.scenes_equal`."""

from __future__ import annotations

import numpy as np

from unimodal.core.errors import InputError
from unimodal.core.grammar import COLORS, IMAGE_SIZE, POSITIONS, SIZE_THRESHOLD, canonical_scene
from unimodal.judges.common import as_uint8_images, require

MIN_OBJECT_AREA = 15  # px; smaller components are codec noise, not objects (a small triangle has ~160)
MIN_CHROMA = 24  # below this a pixel's hue is noise (the background is gray, chroma ~0)
COVERAGE_THRESHOLD = 0.5  # a pixel belongs to an object when it is at least half covered by it
# Shape rules, measured on 500 rendered test scenes and on copies blurred (sigma 1 and 1.5), JPEG-compressed
# (q40, q60), blurred then JPEG'd, shrunk 2x and 4x and enlarged back, noisy and desaturated: the judge reads
# all of them 100% right, and each rule keeps a gap between the shapes it separates (ranges over all copies).
CROSS_MAX_SOLIDITY = 0.85  # cross 0.75 (up to 0.93 when small and blurred); the other shapes 0.88+
CROSS_MAX_CORNER_FILL = 0.08  # cross bbox corners stay empty (0.0); circle 0.13+, triangle 0.31+, square 0.67+
CROSS_MAX_EXTENT = 0.67  # cross 0.48-0.62; circle 0.71+ (triangle, the other low one, has full bottom corners)
TRIANGLE_MAX_TOP_SHARE = 0.41  # triangle (apex up) 0.25-0.37; the other shapes 0.46-0.56
SQUARE_MIN_CORNER_FILL = 0.6  # square 0.67+; circle up to 0.35, triangle up to 0.5, cross 0
_LUMA = np.array([0.299, 0.587, 0.114], np.float32)


def _hue_chroma_luma(rgb: np.ndarray, cv2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hue in degrees, chroma (max - min channel) and luma, all on the 0..255 scale but hue."""
    f = rgb.astype(np.float32) / 255.0
    hue = cv2.cvtColor(np.ascontiguousarray(f), cv2.COLOR_RGB2HSV)[..., 0]
    return hue, (f.max(-1) - f.min(-1)) * 255.0, (f @ _LUMA) * 255.0


def _hue_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = np.abs(a - b) % 360.0
    return np.minimum(d, 360.0 - d)


def _circular_median_hue(hues: np.ndarray) -> float:
    """Median hue, taken after rotating so the circular mean sits at 180 (red wraps around 0/360)."""
    angles = np.deg2rad(hues)
    mean = np.rad2deg(np.arctan2(np.sin(angles).mean(), np.cos(angles).mean()))
    rotated = (hues - mean + 180.0) % 360.0
    return float((np.median(rotated) + mean - 180.0) % 360.0)


def _nearest(point: tuple[float, float], anchors: dict) -> str:
    return min(anchors, key=lambda name: (anchors[name][0] - point[0]) ** 2 + (anchors[name][1] - point[1]) ** 2)


def relation_between(a: dict, b: dict) -> str:
    """Where object ``a`` stands relative to ``b``, from the dominant axis of their centre difference."""
    dx, dy = a["center"][0] - b["center"][0], a["center"][1] - b["center"][1]
    if abs(dx) >= abs(dy):
        return "left of" if dx < 0 else "right of"
    return "above" if dy < 0 else "below"


class SceneJudge:
    """Reads the coloured shapes of a scene picture back as grammar attributes.

    Why coverage and not fixed HSV thresholds: the background is a uniform dark gray and every object is a
    flat palette colour, so a pixel's chroma and its luma above the background both grow linearly with how
    much of it the object covers. Thresholding their average at one half puts the object's edge where the
    renderer put it, whatever the colour or background level, and keeps working on blurred and JPEG copies
    (JPEG smears chroma but keeps luma sharp; the average of the two is stable under both).
    """

    def __init__(self):
        self._cv2 = require("cv2", "opencv-python-headless", "The scene judge")
        palette = np.array([COLORS[name] for name in COLORS], np.uint8)[None]  # (1, K, 3)
        hue, chroma, luma = _hue_chroma_luma(palette, self._cv2)
        self._color_names = list(COLORS)
        self._palette_hue, self._palette_chroma, self._palette_luma = hue[0], chroma[0], luma[0]

    # ------------------------------------------------------------------ detection

    def _foreground(self, rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(H, W) bool object mask and (H, W) hue of one image."""
        hue, chroma, luma = _hue_chroma_luma(rgb, self._cv2)
        gray = chroma < MIN_CHROMA
        background = float(np.median(luma[gray])) if gray.sum() > luma.size // 4 else float(np.median(luma))
        nearest = _hue_distance(hue[..., None], self._palette_hue).argmin(-1)  # (H, W) palette index
        chroma_cover = chroma / self._palette_chroma[nearest]
        luma_cover = (luma - background) / np.maximum(self._palette_luma[nearest] - background, 20.0)
        cover = (chroma_cover + luma_cover) / 2
        return (cover > COVERAGE_THRESHOLD) & (chroma >= MIN_CHROMA), hue

    def _shape_features(self, mask: np.ndarray, box: tuple[int, int, int, int]) -> dict:
        """Solidity, extent, share of pixels in the top half and fill of the bbox corners of one component."""
        cv2 = self._cv2
        x, y, w, h = box
        crop = mask[y:y + h, x:x + w].astype(np.float32)
        area = crop.sum()
        contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
        hull = np.zeros(mask.shape, np.uint8)
        cv2.fillConvexPoly(hull, cv2.convexHull(np.concatenate(contours)), 1)
        rows = crop.sum(1)
        q = max(1, round(min(w, h) / 4))
        corners = (crop[:q, :q], crop[:q, -q:], crop[-q:, :q], crop[-q:, -q:])
        return {"solidity": area / max(hull.sum(), 1),  # pixel counts on both sides: no bias on small shapes
                "extent": area / (w * h),
                "top_share": (rows[:h // 2].sum() + (rows[h // 2] / 2 if h % 2 else 0.0)) / area,
                "corner_fill": float(np.mean([c.mean() for c in corners]))}

    def _shape(self, mask: np.ndarray, box: tuple[int, int, int, int]) -> str:
        f = self._shape_features(mask, box)
        # A blurred small cross fills its inner corners (solidity up to 0.93) but its bbox corners stay empty.
        empty_corners = f["corner_fill"] < CROSS_MAX_CORNER_FILL and f["extent"] < CROSS_MAX_EXTENT
        if f["solidity"] < CROSS_MAX_SOLIDITY or empty_corners:
            return "cross"
        if f["top_share"] < TRIANGLE_MAX_TOP_SHARE:
            return "triangle"
        return "square" if f["corner_fill"] > SQUARE_MIN_CORNER_FILL else "circle"

    def _describe(self, component: np.ndarray, stats: np.ndarray, center: np.ndarray, hue: np.ndarray) -> dict:
        x, y, w, h, area = (int(v) for v in stats)
        color_index = int(_hue_distance(_circular_median_hue(hue[component]), self._palette_hue).argmin())
        cx, cy = float(center[0]), float(center[1])
        return {"shape": self._shape(component, (x, y, w, h)), "color": self._color_names[color_index],
                "size": "large" if max(w, h) > SIZE_THRESHOLD else "small",
                "position": _nearest((cx, cy), POSITIONS), "center": (cx, cy), "bbox": (x, y, w, h), "area": area}

    def judge(self, image) -> list[dict]:
        """Objects found in one image, left to right: shape, color, size, position, center, bbox, area.

        ``position`` is the nearest single-object anchor of the grammar; ``bbox`` is (x, y, w, h) in pixels.
        """
        rgb = as_uint8_images(image, "image")
        if rgb.shape[0] != 1:
            raise InputError(f"judge takes one image; got a batch of {rgb.shape[0]}")
        rgb = np.repeat(rgb[0], 3, -1) if rgb.shape[-1] == 1 else rgb[0]
        if rgb.shape[:2] != (IMAGE_SIZE, IMAGE_SIZE):  # the grammar's geometry is on a 64x64 canvas
            rgb = self._cv2.resize(rgb, (IMAGE_SIZE, IMAGE_SIZE), interpolation=self._cv2.INTER_AREA)
        mask, hue = self._foreground(rgb)
        n, labels, stats, centers = self._cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
        objects = [self._describe(labels == i, stats[i], centers[i], hue)
                   for i in range(1, n) if stats[i, 4] >= MIN_OBJECT_AREA]
        return sorted(objects, key=lambda obj: obj["center"])

    def attributes(self, image) -> dict | None:
        """The scene as grammar attributes (canonical relation), or None unless it holds one or two objects.

        Two objects come in the canonical order of :func:`unimodal.core.grammar.canonical_scene` ('left of' or
        'above'), so the result compares with :func:`unimodal.core.grammar.scenes_equal` directly.
        """
        objects = self.judge(image)
        keys = ("shape", "color", "size")
        if len(objects) == 1:
            return {"objects": [{k: objects[0][k] for k in (*keys, "position")}], "relation": None}
        if len(objects) == 2:
            a, b = objects
            attrs = {"objects": [{k: a[k] for k in keys}, {k: b[k] for k in keys}], "relation": relation_between(a, b)}
            return canonical_scene(attrs)
        return None

    def score(self, image, attrs: dict) -> dict:
        """Per-attribute correctness of one image against the expected attributes.

        Detected objects are matched to expected ones by colour, then by shape, then in order; each of
        ``shape``, ``color``, ``size`` is True when every expected object has it right, ``position`` (one
        object) or ``relation`` (two) likewise, the other one None. ``objects_right`` counts expected
        objects right in every attribute; ``correct`` needs all of that and no missing or extra object;
        ``per_object``: for each of ``shape``, ``color``, ``size``, one verdict per expected object, in order.
        """
        expected = attrs.get("objects") if isinstance(attrs, dict) else None
        if not expected:
            raise InputError(f"attrs must be scene attributes {{'objects': [...], 'relation': ...}}; got {attrs!r}")
        detected = self.judge(image)
        matched = _match_objects(expected, detected)
        right = {key: [d is not None and d[key] == e[key] for e, d in zip(expected, matched)]
                 for key in ("shape", "color", "size")}
        single = len(expected) == 1
        position = relation = None
        if single:
            position = matched[0] is not None and matched[0]["position"] == expected[0].get("position")
        else:
            found = len(matched) == 2 and all(d is not None for d in matched)
            relation = found and relation_between(*matched) == attrs.get("relation")
        objects_right = [all(right[key][i] for key in right) for i in range(len(expected))]
        if single:
            objects_right = [objects_right[0] and position]
        summary = {key: all(values) for key, values in right.items()}
        correct = all(summary.values()) and len(detected) == len(expected) and (position if single else relation)
        return {"correct": bool(correct), **summary, "position": position, "relation": relation,
                "objects_right": int(sum(objects_right)), "n_expected": len(expected), "n_detected": len(detected),
                "per_object": {key: [bool(v) for v in values] for key, values in right.items()}}


def _match_objects(expected: list[dict], detected: list[dict]) -> list[dict | None]:
    """For each expected object, the detected one that stands for it (or None when too few were found)."""
    matched: list[dict | None] = [None] * len(expected)
    free = list(detected)
    for same in (lambda e, d: d["color"] == e["color"], lambda e, d: d["shape"] == e["shape"], lambda e, d: True):
        for i, obj in enumerate(expected):
            if matched[i] is None:
                hit = next((j for j, d in enumerate(free) if same(obj, d)), None)
                if hit is not None:
                    matched[i] = free.pop(hit)
    return matched


# --------------------------------------------------------------------------------------------------- digits
