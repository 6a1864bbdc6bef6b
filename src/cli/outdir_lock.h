/* One training run per output directory: an exclusive lock on OUT/.lock for the whole run. */
#ifndef FX_CLI_OUTDIR_LOCK_H
#define FX_CLI_OUTDIR_LOCK_H

/* Takes the lock on dir (which must exist) without waiting. CLI_EXIT_OK, or CLI_EXIT_FAIL
   with the error printed: another process holds it ("... in use by ... pid N"), or the lock
   file cannot be made. The kernel drops the lock if the process dies. */
int outdir_lock(const char *dir);
/* Removes the lock file and drops the lock (nothing when none is held). */
void outdir_unlock(void);

#endif
