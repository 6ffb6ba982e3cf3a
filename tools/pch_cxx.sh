#!/usr/bin/env bash
# The C++ compiler of mmcv's build (tools/build_mmcv.sh sets CXX to this): the real compiler ($PCH_REAL_CXX),
# with torch's tensor headers parsed once for the build instead of once per translation unit.
#
# Nearly all of mmcv's units start with its `pytorch_cpp_helper.hpp`, i.e. <torch/types.h>, whose parse is
# most of their compile (nms.cpp: 15 of 21.5 CPU-s). The first C++ compile builds a precompiled header of
# <torch/types.h> ($PCH_DIR/torch_types.hpp.gch) with that compile's own flags, under a lock (ninja runs
# several compiles at once: those started meanwhile compile as they are); every later unit gets
# `-include $PCH_DIR/torch_types.hpp`, which GCC reads from the .gch (a unit that includes <torch/types.h>
# again gets nothing more: it is include-guarded). The units' own code and flags are unchanged, and so are
# their objects (compared byte for byte, docs/pins.md). Left as they are: `pybind.cpp` (renamed `_pybind.cpp` by mmcv_unity.py; it includes
# <torch/extension.h> first; in another order its object differs), links, CUDA sources, and every unit
# where the header cannot be built.
set -euo pipefail
cxx=${PCH_REAL_CXX:-c++}
if [ "$(command -v "$cxx")" = "$(command -v "$0")" ]; then echo "error: PCH_REAL_CXX names $0 itself" >&2; exit 2; fi
[ -n "${PCH_DIR:-}" ] || exec "$cxx" "$@"

src="" out=""
flags=() deps=()
next=""
for arg in "$@"; do  # a compile: `... -c ... <source> ... -o <object> ...` (torch's ninja rule, setuptools)
  case "$next" in
    out) out=$arg; next=""; continue;;
    dep) deps+=("$arg"); next=""; continue;;
  esac
  case "$arg" in
    -o) next=out;;
    -MF) deps+=("$arg"); next=dep;;
    -MMD|-MD) deps+=("$arg");;
    -c) ;;
    -*) flags+=("$arg");;
    *.cpp|*.cc|*.cxx) if [ -z "$src" ]; then src=$arg; else flags+=("$arg"); fi;;
    *) flags+=("$arg");;
  esac
done
if [ -z "$src" ] || [ -z "$out" ] || [[ "$(basename "$src")" == pybind.cpp || "$(basename "$src")" == _pybind.cpp ]] || ! command -v flock >/dev/null; then
  exec "$cxx" "$@"
fi

header="$PCH_DIR/torch_types.hpp"
if [ ! -f "$header.gch" ] && [ ! -f "$header.failed" ]; then
  mkdir -p "$PCH_DIR"
  exec 9>"$PCH_DIR/.lock"
  # one compile builds the header; one that finds it being built compiles as is meanwhile, not waiting idle
  flock -n 9 || exec "$cxx" "$@"
  if [ ! -f "$header.gch" ] && [ ! -f "$header.failed" ]; then
    printf '#ifndef DPNREPRO_TORCH_TYPES_PCH\n#define DPNREPRO_TORCH_TYPES_PCH\n#include <torch/types.h>\n#endif\n' > "$header"
    if "$cxx" "${flags[@]}" -x c++-header "$header" -o "$header.gch.partial" > "$PCH_DIR/build.log" 2>&1; then
      mv "$header.gch.partial" "$header.gch"
    else
      touch "$header.failed"  # every unit then parses the headers itself, as without this script
    fi
  fi
  exec 9>&-
fi
if [ -f "$header.gch" ]; then
  exec "$cxx" "${deps[@]}" -include "$header" "${flags[@]}" -c "$src" -o "$out"
fi
exec "$cxx" "$@"
