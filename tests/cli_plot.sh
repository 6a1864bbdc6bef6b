#!/usr/bin/env bash
# flexc plot: PNG and SVG images of the right size from a real training run's metrics, two
# runs overlaid, options, and bad or empty metrics refused with a clear error (exit 1) or a
# usage error (exit 2) without writing the image. Exits 77 (skipped) when flexc was built
# without cairo, after checking that it says so.
set -u
flexc=${1:?path to flexc}
tmp=$(mktemp -d /tmp/flexc_cli_plot.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.sh"

if "$flexc" plot "$tmp" -o "$tmp/x.png" 2>&1 | grep -q "built without cairo"; then
    check no-cairo 1 "$flexc" plot "$tmp" -o "$tmp/x.png"
    finish cli_plot || exit 1
    echo "flexc was built without cairo: plot skipped"
    exit 77
fi

# png_is NAME FILE W H: the PNG signature, an IHDR chunk first, and its width and height
# (big-endian, bytes 16..23).
png_is() {
    local sig ihdr w h
    sig=$(od -An -tx1 -N8 "$2" 2>/dev/null | tr -d ' \n')
    ihdr=$(od -An -c -j12 -N4 "$2" 2>/dev/null | tr -d ' \n')
    w=$(od -An -tu1 -j16 -N4 "$2" 2>/dev/null | awk '{print $1 * 16777216 + $2 * 65536 + $3 * 256 + $4}')
    h=$(od -An -tu1 -j20 -N4 "$2" 2>/dev/null | awk '{print $1 * 16777216 + $2 * 65536 + $3 * 256 + $4}')
    if [[ $sig == 89504e470d0a1a0a && $ihdr == IHDR && $w == "$3" && $h == "$4" ]]; then
        ok
    else
        bad "$1: $2 is not a $3 x $4 PNG (signature $sig, chunk '$ihdr', $w x $h)"
    fi
}
# svg_is NAME FILE W H: the root element is <svg> with width="Wpx" height="Hpx", and the file
# parses as XML (with python3 when there is one).
svg_is() {
    if command -v python3 >/dev/null; then
        if python3 - "$2" "$3" "$4" <<'PY'; then ok; else bad "$1: $2 is not a $3 x $4 SVG"; fi
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
want = (sys.argv[2] + "px", sys.argv[3] + "px")
got = (root.get("width"), root.get("height"))
if root.tag != "{http://www.w3.org/2000/svg}svg" or got != want:
    print(f"root {root.tag} {got}, expected svg {want}")
    sys.exit(1)
PY
    else
        contains "$1" "$2" "<svg [^>]*width=\"$3px\" height=\"$4px\""
    fi
}

# ---- a real run: its metrics as flexc train writes them ----
for i in $(seq 1 200); do
    echo "the quick brown fox $((i % 10)) jumps over the lazy dog."
done >"$tmp/corpus.txt"
check train 0 "$flexc" train --model tiny --data "$tmp/corpus.txt" --batch 4 --seq 32 --lr 3e-3 --steps 30 \
    --eval-every 10 --threads 1 --quiet --out "$tmp/run"
check png 0 "$flexc" plot "$tmp/run" -o "$tmp/run.png"
png_is png "$tmp/run.png" 1200 800
check png-silent 0 "$flexc" plot "$tmp/run" -o "$tmp/run.png"
[[ ! -s "$tmp/out" && ! -s "$tmp/err" ]] && ok || bad "png-silent: output on success"
check svg 0 "$flexc" plot "$tmp/run/" -o "$tmp/run.svg"
svg_is svg "$tmp/run.svg" 1200 800
check size 0 "$flexc" plot "$tmp/run" -o "$tmp/small.PNG" --width 640 --height 480
png_is size "$tmp/small.PNG" 640 480
check svg-size 0 "$flexc" plot "$tmp/run" --output="$tmp/small.svg" --width 700 --height 300
svg_is svg-size "$tmp/small.svg" 700 300
check log 0 "$flexc" plot "$tmp/run" -o "$tmp/log.png" --log --smooth 5 --title "a title"
png_is log "$tmp/log.png" 1200 800
cmp -s "$tmp/log.png" "$tmp/run.png" && bad "log: the same image as without --log" || ok
# The same metrics give the same bytes.
check again 0 "$flexc" plot "$tmp/run" -o "$tmp/run2.png"
same deterministic "$tmp/run.png" "$tmp/run2.png"

# ---- overlay: synthetic runs without validation; the second run's colour (orange in
# cairo's SVG: rgb(100%,49.8%,5.5%)) appears only when the second run is drawn ----
mkdir -p "$tmp/a" "$tmp/b"
for i in $(seq 1 150); do
    awk -v i="$i" 'BEGIN { printf "{\"step\":%d,\"loss\":%.4f,\"tokens_per_s\":%d}\n", i, 5 / (1 + i / 20), 20000 + i }'
done >"$tmp/a/metrics.jsonl"
for i in $(seq 1 90); do
    awk -v i="$i" 'BEGIN { printf "{\"step\":%d,\"loss\":%.4f,\"tokens_per_s\":%d}\n", i, 4 / (1 + i / 10), 30000 - i }'
done >"$tmp/b/metrics.jsonl"
orange='stroke:rgb(100%,49.8%,5.5%)'
check one-svg 0 "$flexc" plot "$tmp/a" -o "$tmp/a.svg"
lacks one-colour "$tmp/a.svg" "$orange"
check overlay-svg 0 "$flexc" plot "$tmp/a" "$tmp/b" -o "$tmp/ab.svg"
svg_is overlay-svg "$tmp/ab.svg" 1200 800
has overlay-colour "$tmp/ab.svg" "$orange"
check overlay-png 0 "$flexc" plot "$tmp/a" "$tmp/b" "$tmp/run" -o "$tmp/abr.png"
png_is overlay-png "$tmp/abr.png" 1200 800
check one-png 0 "$flexc" plot "$tmp/a" -o "$tmp/a.png"
cmp -s "$tmp/a.png" "$tmp/abr.png" && bad "overlay: the same image as one run" || ok
# Edge cases that still draw: one point; --log with no positive loss (a linear axis then).
mkdir -p "$tmp/lone" "$tmp/neg"
echo '{"step":7,"loss":3.5}' >"$tmp/lone/metrics.jsonl"
printf '{"step":1,"loss":-1}\n{"step":2,"loss":0}\n' >"$tmp/neg/metrics.jsonl"
check lone 0 "$flexc" plot "$tmp/lone" -o "$tmp/lone.png"
png_is lone "$tmp/lone.png" 1200 800
check log-nonpositive 0 "$flexc" plot "$tmp/neg" -o "$tmp/neg.png" --log
png_is log-nonpositive "$tmp/neg.png" 1200 800
# A file may be named instead of its directory.
check file-arg 0 "$flexc" plot "$tmp/a/metrics.jsonl" -o "$tmp/f.png"
same file-arg "$tmp/a.png" "$tmp/f.png"

# ---- bad metrics: exit 1, the file and line named, no image written ----
mkdir -p "$tmp/empty" "$tmp/broken" "$tmp/noloss" "$tmp/nan" "$tmp/notobj" "$tmp/nostep" "$tmp/nodir"
: >"$tmp/empty/metrics.jsonl"
{ head -n 3 "$tmp/a/metrics.jsonl"; echo '{"step":4,"loss":2.5,'; tail -n 2 "$tmp/a/metrics.jsonl"; } >"$tmp/broken/metrics.jsonl"
echo '{"step":1,"lr":0.001}' >"$tmp/noloss/metrics.jsonl"
{ head -n 2 "$tmp/a/metrics.jsonl"; echo '{"step":3,"loss":"nan"}'; } >"$tmp/nan/metrics.jsonl"
{ head -n 4 "$tmp/a/metrics.jsonl"; echo '[1, 2]'; } >"$tmp/notobj/metrics.jsonl"
echo '{"loss":2.5}' >"$tmp/nostep/metrics.jsonl"
expect_fail() { # NAME TEXT DIR...: exit 1, TEXT in the error, the image not written
    local name=$1 text=$2
    shift 2
    rm -f "$tmp/bad.png"
    check "$name" 1 "$flexc" plot "$@" -o "$tmp/bad.png"
    has "$name" "$tmp/err" "flexc: error: plot: $text"
    [[ -e "$tmp/bad.png" ]] && bad "$name: wrote the image" || ok
}
expect_fail missing-dir "$tmp/nope: No such file or directory" "$tmp/nope"
expect_fail no-metrics "cannot open $tmp/nodir/metrics.jsonl: No such file or directory" "$tmp/nodir"
expect_fail empty "$tmp/empty/metrics.jsonl is empty" "$tmp/empty"
expect_fail broken "$tmp/broken/metrics.jsonl: line 4: broken JSON" "$tmp/broken"
expect_fail no-loss "$tmp/noloss/metrics.jsonl: no 'loss' values" "$tmp/noloss"
expect_fail loss-string "$tmp/nan/metrics.jsonl: line 3: 'loss' is not a number" "$tmp/nan"
expect_fail not-object "$tmp/notobj/metrics.jsonl: line 5: not a JSON object" "$tmp/notobj"
expect_fail no-step "$tmp/nostep/metrics.jsonl: line 1: 'step' is missing" "$tmp/nostep"
expect_fail second-run-bad "$tmp/broken/metrics.jsonl: line 4" "$tmp/a" "$tmp/broken"
# An existing image is left alone when the metrics are bad.
cp "$tmp/a.png" "$tmp/keep.png"
check keep 1 "$flexc" plot "$tmp/broken" -o "$tmp/keep.png"
same keep "$tmp/a.png" "$tmp/keep.png"
# An image that cannot be written.
check unwritable 1 "$flexc" plot "$tmp/a" -o "$tmp/no/such/dir.png"
has unwritable "$tmp/err" "flexc: error: plot: cannot write $tmp/no/such/dir.png"
# A run still writing its last line: that line is left out, with a note.
mkdir -p "$tmp/live"
{ cat "$tmp/a/metrics.jsonl"; printf '{"step":151,"lo'; } >"$tmp/live/metrics.jsonl"
check unfinished 0 "$flexc" plot "$tmp/live" -o "$tmp/live.png" --title t
has unfinished "$tmp/err" "line 151 is unfinished; left out"
check unfinished-ref 0 "$flexc" plot "$tmp/a" -o "$tmp/a-t.png" --title t
same unfinished-image "$tmp/a-t.png" "$tmp/live.png"

# ---- usage errors: exit 2 ----
check no-output 2 "$flexc" plot "$tmp/a"
has no-output "$tmp/err" "-o FILE.svg|FILE.png is required"
check no-dir 2 "$flexc" plot -o "$tmp/x.png"
has no-dir "$tmp/err" "expected at least one run directory"
check bad-ext 2 "$flexc" plot "$tmp/a" -o "$tmp/x.jpg"
has bad-ext "$tmp/err" "the format follows the extension, .svg or .png"
check tiny-size 2 "$flexc" plot "$tmp/a" -o "$tmp/x.png" --width 10
has tiny-size "$tmp/err" "outside [200, 10000] pixels"
check huge-size 2 "$flexc" plot "$tmp/a" -o "$tmp/x.png" --height 100000
check smooth-0 2 "$flexc" plot "$tmp/a" -o "$tmp/x.png" --smooth 0
check unknown 2 "$flexc" plot "$tmp/a" -o "$tmp/x.png" --colour red
check help 0 "$flexc" plot --help
has help "$tmp/out" "usage: flexc plot DIR [DIR...] -o FILE.svg|FILE.png"
check listed 0 "$flexc" --help
contains listed "$tmp/out" "^  plot "
[[ -e "$tmp/x.png" || -e "$tmp/x.jpg" ]] && bad "usage errors wrote an image" || ok

finish cli_plot
