"""Make the report screenshots shown in the README (run from the repository root, with
Chromium installed):  .venv/bin/python docs/screenshots.py

docs/img/report-cpu.png: `make run`'s job (adam-imagenet22k on adam-2014, the optimizer's
plan), from the top of the page to its scalability curve. docs/img/report-gpu.png: GPT-3 175B
on 64 DGX A100 nodes, TP8 PP8 DP8, from the top to its memory section (a bar per stage).
"""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser import Browser  # noqa: E402

PAGES = {
    "report-cpu.png": (["report", "-w", "adam-imagenet22k", "-c", "adam-2014"], "top"),
    "report-gpu.png": (["report", "-w", "gpt3-175b", "-c", "dgx-a100-80g:64", "--tp", "8",
                        "--pp", "8", "--dp", "8", "--global-batch", "1536", "--recompute",
                        "full"], "memory"),
}


def main() -> None:
    from PIL import Image

    out_dir = ROOT / "docs" / "img"
    out_dir.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, Browser(width=1200, height=900) as browser:
        for name, (args, last) in PAGES.items():
            page = Path(tmp) / f"{name}.html"
            subprocess.run([sys.executable, "-m", "dnnscale.cli", *args, "-o", str(page)],
                           check=True, timeout=300)
            problems = browser.open(page).problems
            if problems:
                raise SystemExit(f"{name}: {problems}")
            bottom = browser.evaluate(
                f"document.getElementById('{last}').getBoundingClientRect().bottom + 16")
            png = browser.screenshot()
            image = Image.open(io.BytesIO(png)).convert("RGB")
            image = image.crop((0, 0, image.width, min(image.height, int(bottom))))
            image.quantize(colors=128).save(out_dir / name, optimize=True)
            print(f"{out_dir / name}: {image.width}x{image.height}")


if __name__ == "__main__":
    main()
