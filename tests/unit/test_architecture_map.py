"""docs/architecture.md maps every module of orbit_tasks/; README's layout names every package."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tree() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "orbit_tasks").rglob("*.py")}


def _mapped() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Module map", 1)[1]
    found: set[str] = set()
    package = None
    for line in section.splitlines():
        heading = re.match(r"^### `(orbit_tasks(?:/[\w]+)*)/`$", line)
        if heading:
            package = heading.group(1)
            continue
        row = re.match(r"^\| `([\w]+\.py)` \|", line)
        if row and package:
            found.add(f"{package}/{row.group(1)}")
    return found


def test_every_module_is_on_the_map() -> None:
    missing = sorted(_tree() - _mapped())
    assert not missing, f"modules missing from docs/architecture.md: {missing}"


def test_the_map_names_no_module_that_does_not_exist() -> None:
    gone = sorted(_mapped() - _tree())
    assert not gone, f"docs/architecture.md maps modules that do not exist: {gone}"


def test_readme_layout_names_every_package() -> None:
    readme = (ROOT / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    packages = sorted(
        p.parent.relative_to(ROOT / "orbit_tasks").as_posix()
        for p in (ROOT / "orbit_tasks").rglob("__init__.py")
        if p.parent != ROOT / "orbit_tasks" and "migrations" not in p.parts
    )
    missing = [p for p in packages if f"{p.rsplit('/', 1)[-1]}/" not in layout]
    assert not missing, f"README's layout does not name: {missing}"
