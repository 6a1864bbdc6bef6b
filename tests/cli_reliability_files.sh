#!/usr/bin/env bash
# What a run directory gathers and what is written into it: the temporary files of saves
# killed midway are removed by the next command that takes the directory's lock (never a live
# writer's, never any other file); export refuses to write into a training run or over the
# model it reads, and takes the lock of the directory it writes.
set -u
flexc=${1:?path to flexc}
source "$(dirname "$0")/lib/checks.sh"
scratch cli_files 200
common=(--model tiny --data "$tmp/corpus.txt" --batch 2 --seq 16 --threads 1)
check base 0 "$flexc" train "${common[@]}" --steps 4 --until 2 --quiet --out "$tmp/r"
lacks base-quiet "$tmp/err" "temporary file"

# snapshot DIR: each entry's name, size and modification time.
snapshot() { find "$1" -mindepth 1 -printf '%P %s %T@\n' | sort; }
# temps DIR: the names of DIR's entries that look like a save's temporary file.
temps() { ls -A "$1" | grep -F '.safetensors.tmp-'; }
# list DIR...: the entries on one line.
list() { ls -A "$@" | tr '\n' ' '; }

# ---- a save killed midway ----
# A file size limit below the checkpoint's size kills the resumed run (SIGXFSZ) while it
# writes the checkpoint's temporary file: a real interrupted save, at the same point each time.
cp -r "$tmp/r" "$tmp/k"
half=$(($(stat -c %s "$tmp/k/checkpoint.safetensors") / 2048))
{ (ulimit -c 0 -f "$half"; exec "$flexc" train --resume --quiet --out "$tmp/k") >"$tmp/out" 2>"$tmp/err"; } 2>/dev/null
rc=$?
[[ $rc == $((128 + 25)) ]] && ok || bad "killed save: exit $rc, expected $((128 + 25)) (SIGXFSZ)"
[[ $(temps "$tmp/k" | grep -c '^\.checkpoint\.safetensors\.tmp-') == 1 ]] && ok ||
    bad "killed save: no orphaned temporary file: $(list "$tmp/k")"
same killed-ckpt-kept "$tmp/r/checkpoint.safetensors" "$tmp/k/checkpoint.safetensors"
check killed-resume 0 "$flexc" train --resume --quiet --out "$tmp/k"
contains killed-msg "$tmp/err" \
    "^flexc: removed 1 temporary file ([0-9.]* [kM]B) left by interrupted saves in $tmp/k\$"
[[ -z $(temps "$tmp/k") ]] && ok || bad "killed save: left after the resume: $(temps "$tmp/k" | tr '\n' ' ')"

# ---- planted orphans, a live writer's file and decoys ----
cp -r "$tmp/r" "$tmp/p"
(exit 0) & dead=$!
wait $dead
sleep 300 & live=$!
head -c 2000000 /dev/zero >"$tmp/p/.checkpoint.safetensors.tmp-$dead-0-1a2b3c"
head -c 1000000 /dev/zero >"$tmp/p/.model.safetensors.tmp-$dead-7-ff"
: >"$tmp/p/.checkpoint.safetensors.tmp-$dead-check"
keep=(".checkpoint.safetensors.tmp-$live-0-abc" notes.txt "checkpoint.safetensors.tmp-$dead-0-ab"
      ".checkpoint.safetensors.tmp-$dead-0-xyz" ".checkpoint.safetensors.tmp-$dead-0-ab.keep"
      ".checkpoint.safetensors.tmp-$dead-0-" ".checkpoint.json.tmp-$dead-0-ab" ".safetensors.tmp-$dead-0-ab"
      ".checkpoint.safetensors.tmp-0$dead-0-ab" ".checkpoint.safetensors.tmp-$dead-00-ab"
      ".checkpoint.safetensors.tmp-$dead-1-ab" ".checkpoint.safetensors.tmp-$dead-2-ab"
      ".checkpoint.safetensors.tmp-$dead-3-ab")
for f in "${keep[@]:0:10}"; do echo keep >"$tmp/p/$f"; done
mkdir "$tmp/p/${keep[10]}" && echo keep >"$tmp/p/${keep[10]}/inside"  # a directory
echo target >"$tmp/target" && ln -s "$tmp/target" "$tmp/p/${keep[11]}" # a symbolic link
echo keep >"$tmp/p/${keep[12]}" && ln "$tmp/p/${keep[12]}" "$tmp/hardlink" # a second link
check plant-resume 0 "$flexc" train --resume --quiet --out "$tmp/p"
has plant-msg "$tmp/err" "flexc: removed 3 temporary files (3.0 MB) left by interrupted saves in $tmp/p"
for f in ".checkpoint.safetensors.tmp-$dead-0-1a2b3c" ".model.safetensors.tmp-$dead-7-ff" \
         ".checkpoint.safetensors.tmp-$dead-check"; do
    [[ -e $tmp/p/$f ]] && bad "plant: $f was not removed" || ok
done
for f in "${keep[@]}"; do [[ -e $tmp/p/$f ]] && ok || bad "plant: $f was removed"; done
[[ -f $tmp/target && -f $tmp/p/${keep[10]}/inside ]] && ok || bad "plant: a link's target or a folder's file removed"
# A new run in the directory (--force) sweeps too; the live writer's file stays.
head -c 512 /dev/zero >"$tmp/p/.checkpoint.safetensors.tmp-$dead-1-0"
check plant-force 0 "$flexc" train "${common[@]}" --steps 2 --quiet --force --out "$tmp/p"
has plant-force-msg "$tmp/err" "flexc: removed 1 temporary file (512 bytes) left by interrupted saves in $tmp/p"
[[ -e $tmp/p/${keep[0]} && ! -e $tmp/p/.checkpoint.safetensors.tmp-$dead-1-0 ]] && ok ||
    bad "plant-force: $(list "$tmp/p")"
kill $live

# ---- export never writes into a run or over its own source ----
before=$(snapshot "$tmp/r")
check export-self 1 "$flexc" export --ckpt "$tmp/r" --to "$tmp/r"
has export-self-msg "$tmp/err" "flexc: error: export: --to $tmp/r is --ckpt $tmp/r itself: the export would write over the model it reads; pass a new directory"
ln -s "$tmp/r" "$tmp/rlink"
check export-self-link 1 "$flexc" export --ckpt "$tmp/r" --to "$tmp/rlink/."
has export-self-link-msg "$tmp/err" "export: --to $tmp/rlink/. is --ckpt $tmp/r itself"
check export-file-dir 1 "$flexc" export --ckpt "$tmp/r/model.safetensors" --to "$tmp/./r"
has export-file-dir-msg "$tmp/err" "export: --to $tmp/./r is the directory of --ckpt $tmp/r/model.safetensors:"
[[ $(snapshot "$tmp/r") == "$before" ]] && ok || bad "export-self: $tmp/r changed: $(list "$tmp/r")"
# Another run: by its checkpoint, its metrics, or a flexc model.safetensors without config.json.
cp -r "$tmp/r" "$tmp/r2"
before=$(snapshot "$tmp/r2")
check export-run 1 "$flexc" export --ckpt "$tmp/r" --to "$tmp/r2"
has export-run-msg "$tmp/err" "flexc: error: export: --to $tmp/r2 is a flexc training directory (it holds checkpoint.safetensors): a Hugging Face config.json there would stop generate, export and train --resume from reading the run; pass a new directory"
[[ $(snapshot "$tmp/r2") == "$before" ]] && ok || bad "export-run: $tmp/r2 changed: $(list "$tmp/r2")"
mkdir "$tmp/m1" "$tmp/m2"
cp "$tmp/r/metrics.jsonl" "$tmp/m1/" && cp "$tmp/r/model.safetensors" "$tmp/m2/"
check export-metrics 1 "$flexc" export --ckpt "$tmp/r" --to "$tmp/m1"
has export-metrics-msg "$tmp/err" "--to $tmp/m1 is a flexc training directory (it holds metrics.jsonl)"
check export-model 1 "$flexc" export --ckpt "$tmp/r" --to "$tmp/m2"
has export-model-msg "$tmp/err" "(it holds model.safetensors and no config.json)"
[[ $(ls -A "$tmp/m1") == metrics.jsonl && $(ls -A "$tmp/m2") == model.safetensors ]] && ok ||
    bad "export into a run: files written: $(list "$tmp/m1" "$tmp/m2")"
# A Hugging Face directory may be exported into again, not over itself; a stale temporary
# file of a killed export there goes; the lock file goes with the export.
check export-hf 0 "$flexc" export --ckpt "$tmp/r" --to "$tmp/hf"
head -c 700 /dev/zero >"$tmp/hf/.model.safetensors.tmp-$dead-0-9"
check export-hf-again 0 "$flexc" export --ckpt "$tmp/r" --to "$tmp/hf"
has export-hf-sweep "$tmp/err" "flexc: removed 1 temporary file (700 bytes) left by interrupted saves in $tmp/hf"
[[ $(ls -A "$tmp/hf" | tr '\n' ' ') == "config.json generation_config.json model.safetensors " ]] && ok ||
    bad "export-hf: $(list "$tmp/hf")"
check export-hf-self 1 "$flexc" export --ckpt "$tmp/hf" --to "$tmp/hf"
has export-hf-self-msg "$tmp/err" "export: --to $tmp/hf is --ckpt $tmp/hf itself"
# A refused export leaves no directory behind; a file is not a directory.
check export-bad-ckpt 1 "$flexc" export --ckpt "$tmp/none" --to "$tmp/new"
[[ ! -e $tmp/new ]] && ok || bad "export-bad-ckpt: $tmp/new was made"
check export-to-file 1 "$flexc" export --ckpt "$tmp/r" --to "$tmp/corpus.txt"
has export-to-file-msg "$tmp/err" "export: --to $tmp/corpus.txt is not a directory"

# ---- export takes the lock of the directory it writes ----
mkdir "$tmp/busy"
"$flexc" train "${common[@]}" --steps 100000 --eval-every 0 --quiet --out "$tmp/busy" & busy=$!
for _ in $(seq 100); do [[ -s $tmp/busy/.lock ]] && break; sleep 0.1; done
check export-locked 1 "$flexc" export --ckpt "$tmp/r" --to "$tmp/busy"
has export-locked-msg "$tmp/err" "flexc: error: --to $tmp/busy is in use by another flexc train (pid $busy): one writer per directory; wait for it to end or pass another --to"
[[ ! -e $tmp/busy/config.json && $(cat "$tmp/busy/.lock") == "$busy" ]] && kill -0 $busy && ok ||
    bad "export-locked: the run's directory or lock changed: $(list "$tmp/busy")"
kill -KILL $busy
wait $busy 2>/dev/null
# A run refused by an export's lock names the export: a stand-in holds the lock as export
# does, its command line's second word "export" (a script of that name).
mkdir "$tmp/ex" "$tmp/fake"
cat >"$tmp/fake/export" <<'PY'
import fcntl, os, sys, time
fd = os.open(sys.argv[1] + "/.lock", os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, b"%d\n" % os.getpid())
time.sleep(300)
PY
(cd "$tmp/fake" && exec python3 export "$tmp/ex") & holder=$!
for _ in $(seq 100); do [[ -s $tmp/ex/.lock ]] && break; sleep 0.1; done
check train-locked-by-export 1 "$flexc" train "${common[@]}" --steps 2 --quiet --out "$tmp/ex"
has train-locked-by-export-msg "$tmp/err" "flexc: error: --out $tmp/ex is in use by another flexc export (pid $holder)"
kill $holder

finish cli_reliability_files
