#!/usr/bin/env bash
# Ember's main job (README): installs the packages, builds, checks the install with
# ember-info's self-test, runs the example program, then trains the bundled example with
# ember-train (no arguments: examples/digits.yaml). Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

stage "install packages" install_packages
stage "build" build build
stage "ember-info (self-test)" build/tools/ember-info
stage "example: tensor basics" build/examples/tensor_basics
stage "ember-train (bundled digits example)" build/trainer/ember-train
