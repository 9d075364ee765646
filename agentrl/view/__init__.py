"""`agentrl view`: see inside a run, live, in a browser; or as one self-contained HTML file.

    agentrl view runs/my-run                     # http://127.0.0.1:8100/
    agentrl view runs/a runs/b                   # curves overlaid, the two runs side by side
    agentrl view runs/my-run --export run.html   # one file: scripts, styles and data inlined

The pages read the run folder as it grows (``metrics.jsonl``, ``trajectories.jsonl``, ``token_values.jsonl``,
``plan.json``, ``config.yaml``, an eval's ``results.json``): `agentrl.view.runs` reads, `agentrl.view.pages` shapes
each page, `agentrl.view.app` serves them behind the servers' HTTP guard, `agentrl.view.export` writes the file.
Curves are drawn with uPlot 1.6.32 (MIT, vendored in ``static/`` with its licence); there is no JavaScript build.
"""

from agentrl.view.app import build_app, serve_view
from agentrl.view.export import export_html, export_results
from agentrl.view.runs import EpisodeRow, RunFolder, ViewError, open_runs

__all__ = ["RunFolder", "EpisodeRow", "ViewError", "open_runs", "build_app", "serve_view", "export_html",
           "export_results"]
