"""Where the package lives, and the source checkout (an editable install) around it, which holds run folders,
notebooks and the commit; a plain install has none, and every caller says what it falls back to."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_ROOT = PACKAGE_DIR.parent
# an editable install of this repository: the package sits beside pyproject.toml and notebooks/
CHECKOUT: Path | None = _ROOT if (_ROOT / "pyproject.toml").is_file() and (_ROOT / "notebooks").is_dir() else None


def seed_report_path() -> Path:
    """The reference B200 report, shipped as package data (pyproject's package-data) so comparisons work from any
    install."""
    return PACKAGE_DIR / "data" / "rms_norm_gated_b200.json"
