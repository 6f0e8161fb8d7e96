"""MkDocs hook: the pictures under results/ are served beside the pages (at results/NAME.png),
so the pages show the PNGs the experiments wrote without a copy in docs/."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]


def on_files(files, config):
    for picture in sorted((ROOT / "results").glob("*.png")):
        files.append(
            File(
                f"results/{picture.name}",
                str(ROOT),
                config["site_dir"],
                config["use_directory_urls"],
            )
        )
    return files
