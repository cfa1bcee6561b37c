#!/usr/bin/env bash
# Developer loop after `pip install -e .`: rebuild the C/CUDA/Cython sources in
# the editable build directory and reinstall them into site-packages (the
# editable install does not rebuild on import, see pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
bdir=$(ls -d build/*/ | head -1)
site=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")
cmake --build "$bdir"
cmake --install "$bdir" --prefix "$site" >/dev/null
