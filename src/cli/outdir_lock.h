/* One writer per output directory: an exclusive lock on DIR/.lock while a command writes
   there (train's --out, export's --to), the temporary files of interrupted saves removed once
   it is held, and the files that make a directory a training run's. */
#ifndef FX_CLI_OUTDIR_LOCK_H
#define FX_CLI_OUTDIR_LOCK_H

/* Takes the lock on dir (which must exist) without waiting; opt is the option that named dir
   ("--out", "--to"), for the messages. CLI_EXIT_OK, or CLI_EXIT_FAIL with the error printed:
   another process holds it ("<opt> DIR is in use by another flexc train (pid N)"), or the lock
   file cannot be made. The kernel drops the lock if the process dies. */
int outdir_lock_opt(const char *dir, const char *opt);
/* train --out: outdir_lock_opt(dir, "--out"), then outdir_sweep(dir). */
int outdir_lock(const char *dir);
/* Removes the lock file and drops the lock (nothing when none is held). */
void outdir_unlock(void);

/* With the lock held: removes from dir the temporary files of saves whose writer is gone
   (".NAME.safetensors.tmp-PID-N-HEX" as fx_safetensors_save makes them, and save_check's
   ".NAME.safetensors.tmp-PID-check"; regular files only, and none whose pid is alive on this
   host), and says on stderr how many and how many bytes. A file it cannot remove is named in a
   warning; nothing fails. */
void outdir_sweep(const char *dir);

/* Why dir is a flexc training directory: the file that makes it one ("checkpoint.safetensors",
   "metrics.jsonl", or "model.safetensors and no config.json", which fx_model_load reads as a
   flexc model), or NULL when it is none. */
const char *outdir_run_marker(const char *dir);

#endif
