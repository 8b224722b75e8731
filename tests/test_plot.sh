#!/bin/sh
# tests/test_plot.sh — the pictures of ember-plot and ember-train --plot (trainer/plot.c, PLplot),
# checked by tests/plot_check.py (its own PNG decoder):
#   - a known metrics file (train loss falling, validation loss turning upward after epoch 3)
#     drawn at 640x480: the size, the train-loss colour in most columns of the plot area with its
#     mean row moving down, the validation colour turning upward at epoch 3's x, the x axis
#     starting at 0 (epoch 1's row 1/8 of the way along);
#   - the check refuses a blank image, a picture of the wrong size and one whose validation loss
#     never turns (so it can fail);
#   - SVG output; errors (a missing file, a bad name, a malformed row) name what is wrong;
#   - ember-train --plot on two short epochs of the digits example, and ember-plot of that run's
#     --metrics (JSON lines) and --metrics-steps (CSV) files.
# Run from the build directory (make check does).
set -u
srcdir=${srcdir:-.}
py=${PYTHON3:-python3}
chk="$py $srcdir/tests/plot_check.py"
# Under ASan (scripts/test.sh): PLplot's loaded drivers and fontconfig's caches live until the
# process exits; suppressed by library only (tests/plot.lsan.supp).
# (appended: the last suppressions= wins, and scripts/test.sh's ASan stage sets one for Open MPI)
LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(cd "$srcdir" && pwd)/tests/plot.lsan.supp:print_suppressions=0"
export LSAN_OPTIONS
plot=./tools/ember-plot
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

$chk metrics "$tmp/m.csv" || exit 99
$plot "$tmp/m.csv" -o "$tmp/c.png" --size 640x480 || bad "ember-plot m.csv"
# epochs 1..8 on an axis from 0: the validation loss turns at epoch 3 (3/8), the first
# epoch's row is 1/8 of the way along (an axis from the first row would put it at the edge)
$chk check "$tmp/c.png" 640x480 0.375 0.125 || bad "the known metrics' picture"

# the check can fail
$chk blank "$tmp/w.png" 640x480 || exit 99
$chk check "$tmp/w.png" 640x480 >/dev/null && bad "a blank image passed"
$chk check "$tmp/c.png" 800x600 >/dev/null && bad "a 640x480 picture passed as 800x600"
$chk falling "$tmp/f.csv" || exit 99
$plot "$tmp/f.csv" -o "$tmp/f.png" --size 640x480 || bad "ember-plot f.csv"
$chk check "$tmp/f.png" 640x480 >/dev/null && bad "a validation loss that never turns passed"

$plot "$tmp/m.csv" -o "$tmp/c.svg" --size 640x480 || bad "ember-plot -o c.svg"
$chk svg "$tmp/c.svg" 640x480 || bad "the SVG"

# errors
expect() { # expect RC NEEDLE CMD...: CMD exits RC and says NEEDLE
    want=$1 needle=$2
    shift 2
    out=$("$@" 2>&1)
    rc=$?
    [ "$rc" = "$want" ] || bad "$* exited $rc, not $want: $out"
    case $out in *"$needle"*) ;; *) bad "$* did not say '$needle': $out" ;; esac
}
expect 1 "$tmp/none.csv: cannot read" $plot "$tmp/none.csv" -o "$tmp/x.png"
expect 2 "must end in .png or .svg" $plot "$tmp/m.csv" -o "$tmp/x.jpg"
expect 2 "--size 10x10" $plot "$tmp/m.csv" -o "$tmp/x.png" --size 10x10
printf 'epoch,step,lr,train_loss\n1,10,0.1,2.0\n2,20,0.1,zwei\n' > "$tmp/bad.csv"
expect 1 "bad.csv:3: field 4 ('zwei') is not a number" $plot "$tmp/bad.csv" -o "$tmp/x.png"
printf 'a,b\n1,2\n' > "$tmp/other.csv"
expect 1 "other.csv:1: not a --metrics or --metrics-steps file" $plot "$tmp/other.csv" -o "$tmp/x.png"
[ -e "$tmp/x.png" ] && bad "a failed ember-plot left x.png"

# the trainer's --plot, and ember-plot of a real run's files
./trainer/ember-train "$srcdir/examples/digits.yaml" --epochs 2 --limit-batches 12 \
    --log-every 3 --seed 1 --quiet --plot "$tmp/t.png" --metrics "$tmp/e.jsonl" \
    --metrics-steps "$tmp/s.csv" || bad "ember-train --plot"
$chk decode "$tmp/t.png" 1000x800 || bad "ember-train --plot's picture"
$plot "$tmp/e.jsonl" "$tmp/s.csv" -o "$tmp/r.png" --size 800x600 --title "digits" ||
    bad "ember-plot e.jsonl s.csv"
$chk decode "$tmp/r.png" 800x600 || bad "ember-plot's picture of the run"
exit $fail
