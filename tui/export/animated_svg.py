"""An animated SVG of the dashboard that plays in a browser and in a README (<img>: no script needed).

Frame 0 is the whole screen; each later frame holds only the cells that changed, drawn opaque over the
frames before it and shown from its time on (SMIL, one <animate> per frame, looping). Styles are shared
CSS classes, so a 60 s recording stays a few MB where stacked screenshots would be tens."""

from __future__ import annotations

import math
from html import escape

from rich.cells import cell_len
from rich.color import Color
from rich.style import Style
from rich.terminal_theme import SVG_EXPORT_THEME, TerminalTheme

from batchtop.tui.export.diff import grid_changes, runs
from batchtop.tui.export.screen import Cell, Grid

FONT_PX = 20  # the metrics of Rich's (and so Textual's `p`) SVG screenshots, so the two look alike
CELL_W = FONT_PX * 0.61
LINE_H = FONT_PX * 1.22
PAD_LEFT, PAD_TOP, PAD_RIGHT, PAD_BOTTOM = 9, 41, 9, 9  # the window's margin and its title bar
HOLD_S = 3.0  # the last picture stays this long before the animation starts over

FIRA = "https://cdnjs.cloudflare.com/ajax/libs/firacode/6.2.0/woff2"  # where Rich's screenshots load it from
FONTS = f"""@font-face {{ font-family: "Fira Code"; font-weight: 400;
  src: local("FiraCode-Regular"), url("{FIRA}/FiraCode-Regular.woff2") format("woff2"); }}
@font-face {{ font-family: "Fira Code"; font-weight: 700;
  src: local("FiraCode-Bold"), url("{FIRA}/FiraCode-Bold.woff2") format("woff2"); }}
.m {{ font-family: "Fira Code", monospace; font-size: 20px; font-variant-east-asian: full-width; }}
.title {{ font-size: 18px; font-weight: bold; font-family: arial; }}
.m rect {{ shape-rendering: crispEdges; }}"""  # no half-covered pixel keeps a colour an earlier frame painted


def num(value: float) -> str:
    return f"{round(value, 2):g}"


def _hex(color: Color | None, default: str, theme: TerminalTheme) -> str:
    return default if color is None or color.is_default else color.get_truecolor(theme).hex


class SvgWriter:
    """Collects a frame at a time; holds the SVG elements of each change, never whole screens."""

    def __init__(self, width: int, height: int, title: str, theme: TerminalTheme = SVG_EXPORT_THEME) -> None:
        self.width, self.height, self.title, self.theme = width, height, title, theme
        self.fg0, self.bg0 = theme.foreground_color.hex, theme.background_color.hex
        self.frames: list[tuple[float, str]] = []  # (start seconds, the frame's elements)
        self._classes: dict[str, str] = {}  # CSS rule -> class name, shared by every frame
        self._colours: dict[Style, tuple[str, str]] = {}
        self._shown: Grid | None = None
        self._owners: list[list[tuple[int, int] | None]] | None = None  # per cell: the text on top's span

    @property
    def num_frames(self) -> int:
        return len(self.frames)

    def add(self, t: float, grid: Grid) -> None:
        """The screen at t seconds of the recording; a frame that changed nothing adds nothing."""
        if self._owners is None or len(self._owners) != len(grid):
            self._owners = [[None] * len(row) for row in grid]
        spans: dict[int, list[tuple[int, int]]] = {}
        for y, start, end in grid_changes(self._shown, grid):
            spans.setdefault(y, []).append(self._cover(y, start, end))
        rects: list[str] = []
        texts: list[str] = []
        for y, row_spans in spans.items():
            row_texts: list[str] = []
            for start, end in _merged(row_spans):
                self._span(y, start, grid[y][start:end], rects, row_texts)
            if row_texts:  # clipped to its row, as Rich clips: no glyph outlives its row's repaint
                texts.append(f'<g clip-path="url(#r{y})">{"".join(row_texts)}</g>')
        self._shown = grid
        if rects or texts:
            self.frames.append((t, "".join(rects) + "".join(texts)))

    def _cover(self, y: int, start: int, end: int) -> tuple[int, int]:
        """The span widened to every text it cuts into: a renderer that ignores textLength (rsvg) places
        glyphs a little off the cell grid, and half-hidden text would leave slivers beside the change."""
        owners = self._owners[y]
        while True:
            cut = [owner for owner in owners[start:end] if owner]
            wider = (min([start, *(a for a, _ in cut)]), max([end, *(b for _, b in cut)]))
            if wider == (start, end):
                return start, end
            start, end = wider

    def _colour_pair(self, style: Style) -> tuple[str, str]:
        """(text, background) colours as Rich's SVG export resolves them: reverse swaps, dim blends."""
        if style not in self._colours:
            fg, bg = _hex(style.color, self.fg0, self.theme), _hex(style.bgcolor, self.bg0, self.theme)
            if style.reverse:
                fg, bg = bg, fg
            if style.dim:
                fg = _blend(fg, bg, 0.4)
            self._colours[style] = (fg, bg)
        return self._colours[style]

    def _class(self, rule: str, prefix: str) -> str:
        if rule not in self._classes:
            self._classes[rule] = f"{prefix}{len(self._classes)}"
        return self._classes[rule]

    def _text_class(self, style: Style) -> str:
        rule = [f"fill:{self._colour_pair(style)[0]}"]
        if style.bold:
            rule.append("font-weight:bold")
        if style.italic:
            rule.append("font-style:italic")
        if style.underline or style.strike:
            rule.append("text-decoration:" + ("underline" if style.underline else "line-through"))
        return self._class(";".join(rule), "c")

    def _span(self, y: int, x0: int, cells: tuple[Cell, ...], rects: list[str], texts: list[str]) -> None:
        """Opaque backgrounds over the whole span (they hide what earlier frames drew there), and its text."""
        top = num(y * LINE_H + 1.5)
        for a, b, bg in runs(cells, lambda cell: self._colour_pair(cell[1])[1]):
            rects.append(f'<rect class="{self._class(f"fill:{bg}", "c")}" x="{num((x0 + a) * CELL_W)}" y="{top}" '
                       f'width="{num((b - a) * CELL_W)}" height="{num(LINE_H + 0.25)}"/>')
        base, owners = num(y * LINE_H + FONT_PX), self._owners[y]
        for a, b, style in runs(cells, lambda cell: cell[1]):
            text = "".join(char for char, _ in cells[a:b])
            owners[x0 + a:x0 + b] = [None] * (b - a)
            if not (style.underline or style.strike):  # blanks draw nothing over their background
                stripped = text.lstrip(" ")
                a += len(text) - len(stripped)
                text = stripped.rstrip(" ")
            if not text:
                continue
            cells_long = cell_len(text)
            owners[x0 + a:x0 + a + cells_long] = [(x0 + a, x0 + a + cells_long)] * cells_long
            length = f' textLength="{num(cells_long * CELL_W)}"' if cells_long > 1 else ""
            texts.append(f'<text class="{self._text_class(style)}" x="{num((x0 + a) * CELL_W)}" y="{base}"{length}>'
                       f'{escape(text, quote=False).replace(" ", "&#160;")}</text>')

    def text(self, end_t: float, still_at: float | None = None) -> str:
        """The whole SVG, looping every end_t + HOLD_S seconds; still_at: a still picture of that moment
        instead (the frames up to it, no animation), as rsvg-convert or a print would show it."""
        cycle = max(end_t, self.frames[-1][0] if self.frames else 0.0) + HOLD_S
        body: list[str] = []
        for i, (t, parts) in enumerate(self.frames):
            if still_at is not None:
                if t > still_at:
                    break
                body.append(f"<g>{parts}</g>")
            elif i == 0 or t <= 0:
                body.append(f"<g>{parts}</g>")
            else:
                body.append(f'<g visibility="hidden"><animate attributeName="visibility" calcMode="discrete" '
                            f'values="hidden;visible" keyTimes="0;{t / cycle:.6f}" dur="{num(cycle)}s" '
                            f'repeatCount="indefinite"/>{parts}</g>')
        return self._document("\n".join(body))

    def _document(self, body: str) -> str:
        inner_w, inner_h = math.ceil(self.width * CELL_W), self.height * LINE_H
        w, h = inner_w + PAD_LEFT + PAD_RIGHT, num(inner_h + PAD_TOP + PAD_BOTTOM)
        # each row's text is clipped half a unit inside the background a repaint lays over it
        rows = "".join(f'<clipPath id="r{y}"><rect x="0" y="{num(y * LINE_H + 2)}" width="{inner_w}" '
                       f'height="{num(LINE_H - 0.75)}"/></clipPath>' for y in range(self.height))
        classes = "\n".join(f".{name} {{ {rule} }}" for rule, name in self._classes.items())
        return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}">\n'
                f"<title>{escape(self.title)}</title>\n<style>\n{FONTS}\n{classes}\n</style>\n"
                f'<defs><clipPath id="screen"><rect x="0" y="0" width="{inner_w}" height="{num(inner_h + 2)}"/>'
                f"</clipPath>{rows}</defs>\n"
                f'<rect fill="{self.bg0}" stroke="rgba(255,255,255,0.35)" stroke-width="1" x="1" y="1" '
                f'width="{w - 2}" height="{num(inner_h + PAD_TOP + PAD_BOTTOM - 2)}" rx="8"/>\n'
                f'<text class="title" fill="{self.fg0}" text-anchor="middle" x="{w // 2}" y="27">'
                f"{escape(self.title)}</text>\n"
                '<g transform="translate(26,22)"><circle cx="0" cy="0" r="7" fill="#ff5f57"/>'
                '<circle cx="22" cy="0" r="7" fill="#febc2e"/><circle cx="44" cy="0" r="7" fill="#28c840"/></g>\n'
                f'<g transform="translate({PAD_LEFT},{PAD_TOP})" clip-path="url(#screen)" class="m">\n{body}\n</g>\n'
                "</svg>\n")


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Spans that overlap once widened, as one."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(end, out[-1][1]))
        else:
            out.append((start, end))
    return out


def _blend(fg: str, bg: str, amount: float) -> str:
    """fg moved `amount` of the way to bg (how Rich draws dim text)."""
    a, b = Color.parse(fg).get_truecolor(), Color.parse(bg).get_truecolor()
    mix = [round(x + (y - x) * amount) for x, y in zip(a, b)]
    return "#{:02x}{:02x}{:02x}".format(*mix)
