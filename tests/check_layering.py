#!/usr/bin/env python3
"""The layering rule of docs/ARCHITECTURE.md: a folder of src/loom includes only itself and
the folders below it. The table is the one CMakeLists.txt links (loom_folder_library DEPS),
closed transitively here. Exits 1 naming every include that breaks the rule, and every cycle.

Usage: check_layering.py SRC_DIR   (the src/loom folder)
"""
import pathlib
import re
import sys

# Direct dependencies, as CMakeLists.txt links the folder libraries.
DIRECT = {
    "core": [],
    "kernels": ["core"],
    "data": ["core"],
    "obs": ["core"],
    "dist": ["core"],
    "model": ["kernels"],
    "optim": ["model", "dist"],
    "parallel": ["optim", "obs"],
    "ckpt": ["model"],
    "plan": ["parallel"],
    # plan/: the trainer reports MFU against a GPU's datasheet peak (plan/hardware).
    "train": ["ckpt", "parallel", "data", "plan"],
    "cli": ["train", "plan"],
}
EXCEPTIONS = set()


def closure(folder, seen=None):
    seen = set() if seen is None else seen
    for dep in DIRECT[folder]:
        if dep not in seen:
            seen.add(dep)
            closure(dep, seen)
    return seen


def main(src):
    root = pathlib.Path(src)
    include = re.compile(r'^\s*#\s*include\s+"loom/([a-z_]+)/')
    problems = []
    folders = sorted(p.name for p in root.iterdir() if p.is_dir())
    for folder in folders:
        if folder not in DIRECT:
            problems.append(f"src/loom/{folder}/ is not in the layering table of tests/check_layering.py")
            continue
        allowed = closure(folder) | {folder}
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in {".hpp", ".cpp", ".cu", ".cuh"}:
                continue
            rel = path.relative_to(root).as_posix()
            for n, line in enumerate(path.read_text().splitlines(), 1):
                m = include.match(line)
                if m and m.group(1) not in allowed and (rel, m.group(1)) not in EXCEPTIONS:
                    problems.append(f"src/loom/{rel}:{n}: {folder}/ includes {m.group(1)}/, "
                                    f"which is not below it (allowed: {', '.join(sorted(allowed))})")
    # The table itself must be a DAG (a cycle would make every folder in it 'below' itself).
    for folder in DIRECT:
        if folder in closure(folder):
            problems.append(f"layering table: {folder} depends on itself (a cycle)")
    for p in problems:
        print(p)
    print(f"{len(folders)} folders checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "src/loom"))
