/* flexc export --ckpt DIR|FILE --to HFDIR: a model as a Hugging Face directory transformers
   loads (config.json, generation_config.json, model.safetensors, the tokenizer files). */
#include "cli.h"

#include "hf/hf.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/model.h"
#include "outdir_lock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Where the Hugging Face files of the model's origin are: the --ckpt directory itself when it
   is a Hugging Face model, else its hf/ folder (what `flexc train --model HFDIR` keeps). */
static bool origin_dir(char *buf, size_t n, const char *ckpt)
{
    struct stat st;
    if (stat(ckpt, &st) != 0 || !S_ISDIR(st.st_mode))
        return false;
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/config.json", ckpt);
    if (access(probe, F_OK) == 0) {
        snprintf(buf, n, "%s", ckpt);
        return true;
    }
    snprintf(probe, sizeof probe, "%s/hf/config.json", ckpt);
    if (access(probe, F_OK) == 0) {
        snprintf(buf, n, "%s/hf", ckpt);
        return true;
    }
    return false;
}

static bool same_dir(const struct stat *a, const char *path)
{
    struct stat b;
    return stat(path, &b) == 0 && S_ISDIR(b.st_mode) && a->st_dev == b.st_dev && a->st_ino == b.st_ino;
}

/* --to must not be where the model is read from: --ckpt itself, the directory holding the
   --ckpt file, or its origin (a run's hf/); the same directory by device and inode, whatever
   the spelling. Checked before anything is read or written. Prints its error. */
static bool export_check_source(const char *to, const char *ckpt, const char *origin)
{
    struct stat t, c;
    if (stat(to, &t) != 0)
        return true; /* made by the export */
    if (!S_ISDIR(t.st_mode)) {
        cli_error("export: --to %s is not a directory", to);
        return false;
    }
    char why[4400] = "";
    if (stat(ckpt, &c) == 0 && S_ISDIR(c.st_mode)) {
        if (c.st_dev == t.st_dev && c.st_ino == t.st_ino)
            snprintf(why, sizeof why, "is --ckpt %s itself", ckpt);
    } else {
        char parent[4096];
        snprintf(parent, sizeof parent, "%s", ckpt);
        char *slash = strrchr(parent, '/');
        if (!slash)
            snprintf(parent, sizeof parent, ".");
        else if (slash == parent)
            parent[1] = '\0'; /* "/file": the root */
        else
            *slash = '\0';
        if (same_dir(&t, parent))
            snprintf(why, sizeof why, "is the directory of --ckpt %s", ckpt);
    }
    if (!why[0] && origin && same_dir(&t, origin))
        snprintf(why, sizeof why, "is %s, where --ckpt %s takes its Hugging Face configuration and tokenizer from",
                 origin, ckpt);
    if (!why[0])
        return true;
    cli_error("export: --to %s %s: the export would write over the model it reads; pass a new directory", to, why);
    return false;
}

/* --to, created when missing and locked for the export (a train or another export writing
   there is refused), and not a training run's: a Hugging Face config.json in a run makes
   generate, export and train --resume read it as a Hugging Face model from the next save on.
   Then the temporary files of interrupted saves go. A refusal leaves the directory as it was;
   *made says whether it was created here. Prints its error. */
static bool export_take_dir(const char *to, bool *made)
{
    *made = mkdir(to, 0755) == 0;
    if (!*made && errno != EEXIST) {
        cli_error("export: --to %s: cannot create the directory: %s", to, strerror(errno));
        return false;
    }
    struct stat st;
    if (stat(to, &st) != 0 || !S_ISDIR(st.st_mode)) {
        cli_error("export: --to %s is not a directory", to);
        return false;
    }
    if (outdir_lock_opt(to, "--to") != CLI_EXIT_OK) {
        if (*made)
            rmdir(to);
        return false;
    }
    const char *marker = outdir_run_marker(to);
    if (marker) {
        cli_error("export: --to %s is a flexc training directory (it holds %s): a Hugging Face config.json "
                  "there would stop generate, export and train --resume from reading the run; pass a new "
                  "directory", to, marker);
        outdir_unlock();
        return false;
    }
    outdir_sweep(to);
    return true;
}

/* The configuration of a model that came from the Hugging Face directory `origin`: its own
   config.json and generation_config.json texts (written back as they were), parsed into hc.
   They must still describe the model m (they do unless files were mixed). Prints its error. */
static bool export_origin_config(fx__hf_config *hc, char **config_text, char **gen_text, const char *origin,
                                 const char *ckpt, const fx_model_config *mc)
{
    char path[4200];
    size_t len = 0;
    int rc;
    if ((rc = fx__hf_config_read(hc, origin)) != FX_OK) {
        cli_fail(rc, "the model's Hugging Face configuration");
        return false;
    }
    snprintf(path, sizeof path, "%s/config.json", origin);
    if ((rc = fx__hf_read_text(config_text, &len, path)) != FX_OK) {
        cli_fail(rc, "config.json");
        return false;
    }
    snprintf(path, sizeof path, "%s/generation_config.json", origin);
    if (access(path, F_OK) == 0 && (rc = fx__hf_read_text(gen_text, &len, path)) != FX_OK) {
        cli_fail(rc, "generation_config.json");
        return false;
    }
    const fx__config_field *differs = fx__config_diff_shape(&hc->m, mc);
    if (differs) {
        cli_error("export: %s/config.json does not describe the model in --ckpt %s (its %s differs)", origin, ckpt,
                  differs->key);
        return false;
    }
    return true;
}

/* Writes m's tensors to `to` under the names of hc's layout (s: everything but the data).
   Prints its error. */
static bool export_tensors(const char *to, const fx_model *m, fx__hf_export_spec *s)
{
    fx__hf_tensor *t = NULL;
    size_t n = 0;
    int rc = fx__hf_layout(&t, &n, &s->c->m);
    if (rc != FX_OK) {
        cli_fail(rc, "export");
        return false;
    }
    const float **data = calloc(n, sizeof *data);
    if (!data) {
        fx__free(t);
        cli_error("out of memory");
        return false;
    }
    for (size_t i = 0; i < n && rc == FX_OK; i++) {
        fx_model_tensor mt;
        if ((rc = fx_model_tensor_find(m, t[i].name, &mt)) == FX_OK)
            data[i] = mt.data;
    }
    if (rc == FX_OK) {
        s->data = data;
        rc = fx__hf_export(to, s);
    }
    if (rc != FX_OK)
        cli_fail(rc, "export");
    free(data);
    fx__free(t);
    return rc == FX_OK;
}

/* Attention written as expressions has no Hugging Face (or PEFT) config key: transformers
   would run the model with its own mask and no score modifier. Whether m has such mods (said). */
static bool mods_refused(const fx_model *m, const char *ckpt)
{
    if (!m->mask_src && !m->score_src)
        return false;
    char mods[2 * FX__MOD_SRC_MAX + 64] = "";
    if (m->mask_src)
        snprintf(mods, sizeof mods, "--mask-mod \"%s\"%s", m->mask_src, m->score_src ? ", " : "");
    if (m->score_src)
        snprintf(mods + strlen(mods), sizeof mods - strlen(mods), "--score-mod \"%s\"", m->score_src);
    cli_error("export: --ckpt %s was trained with attention mods (%s), which a Hugging Face config cannot "
              "express; flexc generate runs it", ckpt, mods);
    return true;
}

/* A LoRA run's adapters (or a PEFT directory's, rewritten) as a PEFT adapter directory. */
static int export_adapter(const fx__lora_source *src, const char *ckpt, const char *to, fx_dtype dtype)
{
    fx_model *m = NULL;
    int rc = fx__lora_open(&m, src, false); /* the base mapped: the adapters checked against it */
    if (rc != FX_OK)
        return cli_fail(rc, "--ckpt");
    if (mods_refused(m, ckpt)) {
        fx_model_free(m);
        return CLI_EXIT_FAIL;
    }
    bool made = false;
    if (!export_take_dir(to, &made)) {
        fx_model_free(m);
        return CLI_EXIT_FAIL;
    }
    const fx__lora *a = m->lora;
    if ((rc = fx__lora_export_peft(a, to, src->base, dtype)) != FX_OK)
        cli_fail(rc, "export");
    else
        printf("wrote %s: a PEFT LoRA adapter of %s (rank %lld, alpha %g, %zu tensors, %s) for the base model %s\n",
               to, ckpt, (long long)a->cfg.rank, (double)a->cfg.alpha, a->n, fx_dtype_name(dtype), src->base);
    fx_model_free(m);
    outdir_unlock();
    if (rc != FX_OK && made)
        rmdir(to);
    return rc == FX_OK ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

int cmd_export(int argc, char **argv)
{
    const char *ckpt = NULL, *to = NULL, *dtype_s = NULL;
    bool merge = false;
    const cli_opt opts[] = {
        {"--ckpt", CLI_STRING, &ckpt, "a training --out DIR, a .safetensors file, or a Hugging Face DIR"},
        {"--to", CLI_STRING, &to,
         "the directory to write (created; its files of the same names are replaced; not a training run)"},
        {"--dtype", CLI_STRING, &dtype_s, "f32 | bf16 | f16 (default: the dtype of the model's origin, else f32)"},
        {"--merge", CLI_FLAG, &merge, "LoRA adapters: write the whole model with them merged in (default: a PEFT adapter)"},
    };
    int rc = cli_parse("export", "--ckpt DIR|FILE --to HFDIR [options]", argc, argv, opts,
                       sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (rc == CLI_PARSE_HELP)
        return CLI_EXIT_OK;
    if (rc != CLI_PARSE_OK)
        return rc;
    if (!ckpt || !to) {
        cli_error("export: --ckpt DIR|FILE and --to HFDIR are required");
        return CLI_EXIT_USAGE;
    }
    fx_dtype dtype = FX_DT_F32;
    if (dtype_s) {
        if (!strcmp(dtype_s, "f32"))
            dtype = FX_DT_F32;
        else if (!strcmp(dtype_s, "bf16"))
            dtype = FX_DT_BF16;
        else if (!strcmp(dtype_s, "f16"))
            dtype = FX_DT_F16;
        else {
            cli_error("export: --dtype %s is not f32, bf16 or f16", dtype_s);
            return CLI_EXIT_USAGE;
        }
    }

    /* LoRA adapters (a LoRA run's, or a PEFT directory): written as a PEFT adapter, or merged
       into their base and written as a whole model. */
    fx__lora_source lsrc;
    bool lora = false;
    if ((rc = fx__lora_source_find(ckpt, &lsrc, &lora)) != FX_OK)
        return cli_fail(rc, "--ckpt");
    if (merge && !lora) {
        cli_error("export: --merge: --ckpt %s holds no LoRA adapters (it is a whole model already)", ckpt);
        return CLI_EXIT_USAGE;
    }
    char origin[4096];
    bool has_origin = origin_dir(origin, sizeof origin, ckpt);
    if (lora && !has_origin) /* a PEFT directory: its base is the origin */
        has_origin = origin_dir(origin, sizeof origin, lsrc.base);
    if (!export_check_source(to, ckpt, has_origin ? origin : NULL))
        return CLI_EXIT_FAIL;
    if (lora && !merge)
        return export_adapter(&lsrc, ckpt, to, dtype_s ? dtype : FX_DT_F32);
    fx_model *m = NULL;
    if ((rc = lora ? fx__lora_open(&m, &lsrc, true) : fx_model_load(&m, ckpt)) != FX_OK)
        return cli_fail(rc, "--ckpt");
    if (mods_refused(m, ckpt)) {
        fx_model_free(m);
        return CLI_EXIT_FAIL;
    }
    bool made = false;
    if (!export_take_dir(to, &made)) {
        fx_model_free(m);
        return CLI_EXIT_FAIL;
    }
    const fx_model_config *mc = fx_model_get_config(m);

    /* The configuration: the origin's own when the model came from a Hugging Face directory,
       else one generated from the model. */
    fx__hf_config hc;
    char *config_text = NULL, *gen_text = NULL;
    bool ok;
    if (has_origin) {
        ok = export_origin_config(&hc, &config_text, &gen_text, origin, ckpt, mc);
        if (ok && !dtype_s)
            dtype = hc.dtype;
    } else {
        rc = fx__hf_config_from_model(&hc, mc);
        if (!(ok = rc == FX_OK))
            cli_fail(rc, "export");
    }
    fx__hf_export_spec s = {.c = &hc, .dtype = dtype, .config_text = config_text, .gen_text = gen_text,
                            .tokenizer_dir = has_origin ? origin : NULL};
    if (ok && (ok = export_tensors(to, m, &s)))
        printf("wrote %s: %s, %zu parameters, %s%s\n", to, fx__hf_arch_name(hc.arch), fx_model_num_params(m),
               fx_dtype_name(dtype), has_origin ? "" : " (no tokenizer: the model did not come from a Hugging Face directory)");
    fx__free(config_text);
    fx__free(gen_text);
    fx_model_free(m);
    outdir_unlock();
    if (!ok && made)
        rmdir(to); /* only if nothing was written */
    return ok ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
