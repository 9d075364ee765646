"""`agentrl view RUN --export out.html`: the viewer's pages as one self-contained HTML file.

Scripts (uPlot and the viewer's own), styles and data are inlined, screenshots become ``data:`` URIs: the file
opens offline, from a CI artifact or an e-mail, and fetches nothing. It is a snapshot: no polling, no filter form
(the episode lists are whole), links are anchors inside the file. To keep it small, it holds every run's curves and
episode list but the turn-by-turn pages of at most `max_episodes` episodes per run: the ones with recorded token
values first, then the newest. `agentrl eval` writes its ``report.html`` with it.
"""

from __future__ import annotations

import base64
import mimetypes
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2

from agentrl.view.pages import (
    EpisodeFilter,
    Links,
    compare_page,
    episode_page,
    episodes_page,
    eval_block,
    overview_page,
    render,
)
from agentrl.view.runs import RunFolder, ViewError

__all__ = ["export_html", "export_results", "inline_assets"]

_STATIC = Path(__file__).resolve().parent / "static"
_EXPORT = Links(export=True)


def inline_assets() -> dict[str, str]:
    """The viewer's scripts and styles as text for inlining (a ``</script`` inside them cannot end the tag)."""
    js = "\n".join((_STATIC / name).read_text(encoding="utf-8") for name in ("uPlot.iife.min.js", "view.js"))
    css = "\n".join((_STATIC / name).read_text(encoding="utf-8") for name in ("uPlot.min.css", "view.css"))
    markup = jinja2.utils.markupsafe.Markup  # trusted text of this package, not run data: not escaped
    return {"js": markup(js.replace("</script", "<\\/script")), "css": markup(css.replace("</style", "<\\/style"))}


def _inline_screenshots(run: RunFolder, page: dict[str, Any]) -> None:
    for turn in page["turns"]:
        inlined = []
        for url in turn["screenshots"]:
            path = run.path / url.split("/", 3)[3]
            mime = mimetypes.guess_type(path.name)[0] or "image/png"
            inlined.append(f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii"))
        turn["screenshots"] = inlined


def _document(runs: Sequence[RunFolder], max_episodes: int) -> str:
    overview = overview_page(runs, _EXPORT)
    lists, episodes = [], []
    for run in runs:
        recorded = run.recorded_keys()
        rows = run.episodes()
        chosen = [e.index for e in rows if e.key in recorded][:max_episodes]
        chosen += [e.index for e in reversed(rows) if e.index not in chosen][:max(0, max_episodes - len(chosen))]
        chosen = sorted(chosen)
        listing = episodes_page(run, EpisodeFilter(), links=_EXPORT, limit=10**9)
        keep = set(chosen)
        for group in listing["groups"]:
            for e in group["episodes"]:
                e["href"] = e["href"] if e["index"] in keep else None
        lists.append(listing)
        for index in chosen:
            page = episode_page(run, index, _EXPORT)
            _inline_screenshots(run, page)
            episodes.append(page)
    note = (f"curves and episode lists whole; turn-by-turn pages of up to {max_episodes} episodes per run, "
            "those with recorded token values first")
    return render("export.html", title=overview["title"], runs=overview["runs"], links=_EXPORT,
                  config={"live": False}, inline=inline_assets(), overview=overview,
                  compare=compare_page(runs[0], runs[1], _EXPORT) if len(runs) > 1 else None,
                  episode_lists=lists, episodes=episodes, note=note,
                  created=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def export_html(paths: Sequence[str | Path | RunFolder], out: str | Path, *, max_episodes: int = 50) -> Path:
    """Write the viewer's pages over run folders `paths` into the one HTML file `out`.

    Args:
        paths: run folders (or `RunFolder`s).
        out: the HTML file to write (its folder must exist).
        max_episodes: turn-by-turn pages kept per run.

    Raises:
        ViewError: a folder is missing or not a run folder; `out`'s folder does not exist.
    """
    out = Path(out)
    if not out.parent.is_dir():
        raise ViewError(f"--export {out}: the folder {out.parent} does not exist")
    if not paths:
        raise ViewError("name at least one run folder to export: agentrl view RUN --export out.html")
    runs = [p if isinstance(p, RunFolder) else RunFolder(p, i) for i, p in enumerate(paths)]
    for i, run in enumerate(runs):
        run.index = i
    out.write_text(_document(runs, max_episodes), encoding="utf-8")
    return out


def export_results(results: Mapping[str, Any]) -> str:
    """The export of one evaluation from its results alone (no folder: no episode pages), as a string."""
    title = f"agentrl eval: {results['env']['id']} x {results['model']['name']}"
    overview = {"title": title, "curves": {"runs": []}, "live": False, "waiting": False, "links": _EXPORT,
                "cards": [{"index": 0, "name": str(results["env"]["id"]), "path": "", "problems": [], "lacks": [],
                           "plan": None, "config": None, "episodes": len(results.get("episodes", [])),
                           "eval": eval_block(results)}]}
    return render("export.html", title=title, runs=[], links=_EXPORT, config={"live": False},
                  inline=inline_assets(), overview=overview, compare=None, episode_lists=[], episodes=[],
                  note="the eval's results only", created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
