"""Open a report.html in headless Chromium and check that every figure decodes and has a size.

    python docs/check_report_renders.py inactive-heads-demo/report/report.html [--screenshot shot.png]

Needs a Chromium binary (Debian: ``apt-get install -y chromium``). A probe script is appended to a temporary copy
of the report; after load it writes, for every <img>, whether the browser decoded it, into the DOM that Chromium
dumps. Exit status 0 when every image rendered, 1 otherwise.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_PROBE = """<script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0 && i.getBoundingClientRect().width > 0);
  document.body.setAttribute("data-rendered", ok.length + "/" + imgs.length);
  document.body.setAttribute("data-sizes", imgs.map(i => i.naturalWidth + "x" + i.naturalHeight).join(","));
});
</script>"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("no Chromium found; install it (Debian: apt-get install -y chromium)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--screenshot", type=Path, default=None, help="also save a full-page PNG screenshot")
    args = parser.parse_args()
    if not args.report.is_file():
        sys.exit(f"no report at {args.report}")
    browser = _chromium()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=10000"]
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "report.html"
        probe.write_text(args.report.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"), "utf-8")
        dom = subprocess.run(
            [browser, *flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120
        ).stdout
        if args.screenshot:
            subprocess.run(
                [
                    browser,
                    *flags,
                    "--window-size=1200,2400",
                    f"--screenshot={args.screenshot.resolve()}",
                    args.report.resolve().as_uri(),
                ],
                capture_output=True,
                timeout=120,
                check=True,
            )
    match = re.search(r'data-rendered="(\d+)/(\d+)"', dom)
    if not match:
        print("the probe did not run: Chromium failed to load the page", file=sys.stderr)
        return 1
    ok, total = int(match.group(1)), int(match.group(2))
    sizes = re.search(r'data-sizes="([^"]*)"', dom)
    print(f"{ok}/{total} images rendered ({sizes.group(1) if sizes else ''})")
    return 0 if total and ok == total else 1


if __name__ == "__main__":
    sys.exit(main())
