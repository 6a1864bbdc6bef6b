#!/usr/bin/env bash
# The main job of `make run`. Until the trainer lands: a short benchmark of this machine.
set -euo pipefail
build=${1:-build}
"$build/flexc" bench machine
