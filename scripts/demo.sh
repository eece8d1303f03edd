#!/usr/bin/env bash
# The main job: a tour of quax and its families.
source "$(dirname "$0")/_env.sh"
uv run --locked --no-sync python examples/tour.py
