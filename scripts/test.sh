#!/usr/bin/env bash
# Runs every test suite (placeholder: filled in below by the integration step).
set -euo pipefail
