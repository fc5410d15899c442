"""Print ``run-id=N`` for the latest successful run of a workflow (the nightly baseline).

Reads GITHUB_API_URL, GITHUB_REPOSITORY, GITHUB_RUN_ID, GH_TOKEN (the job's token), WORKFLOW
(a workflow file name) and BRANCH from the environment; prints nothing when there is no earlier
successful run (the first night), so the download step is skipped. Standard library only: it
runs on any runner with Python, hosted or self-hosted, with no GitHub CLI installed.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
import urllib.request


def previous_run(runs: list[dict], current_run_id: str) -> int | None:
    """The newest run that is not this one (the API lists newest first)."""
    for run in runs:
        if str(run.get("id")) != current_run_id and run.get("conclusion") == "success":
            return int(run["id"])
    return None


def main() -> int:
    env = os.environ
    query = urllib.parse.urlencode({"branch": env["BRANCH"], "status": "success", "per_page": 10})
    url = f"{env.get('GITHUB_API_URL', 'https://api.github.com')}/repos/{env['GITHUB_REPOSITORY']}" \
          f"/actions/workflows/{env['WORKFLOW']}/runs?{query}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {env['GH_TOKEN']}",
                                                   "Accept": "application/vnd.github+json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            runs = json.load(response).get("workflow_runs", [])
    except OSError as error:  # no baseline is a warning, never a failed night
        print(f"::warning::cannot list earlier runs of {env['WORKFLOW']}: {error}", file=sys.stderr)
        return 0
    found = previous_run(runs, env.get("GITHUB_RUN_ID", ""))
    if found is not None:
        print(f"run-id={found}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
