/*
 * ckpt.c -- layout-independent checkpoints (see train.h and trainer.md section 4.5).
 *
 * <dir>/step_<8 digits>/ holds
 *   model.bin  256 x int32 header, then P float32 parameters in canonical order;
 *   optim.bin  256 x int32 header, then AdamW m (P float32), then v (P float32);
 *   meta.txt   key=value lines: the config, P, the layout that wrote it, CRC32 of both .bin files;
 *   DONE       created last.
 * Header words (both files): [0] magic, [1] version, [2] L, [3] C, [4] NH, [5] V, [6] T, [7] E,
 * [8] P low 32 bits, [9] P high 32 bits, [10] dtype (0: float32), [11] step; the rest zero.
 *
 * Byte order: files are written and read in host order and the code assumes a little-endian host
 * (x86-64, aarch64); a big-endian build stops at compile time rather than writing files that
 * would not read back elsewhere.
 *
 * Crash safety: everything is written into <dir>/step_N.tmp.<pid>/, each file fsynced, then the
 * folder fsynced, renamed to step_N and <dir> fsynced; only then is DONE created (and fsynced,
 * with its folder). A crash at any point leaves either a .tmp folder (ignored, removed by prune),
 * or a step_N without DONE (skipped), or a complete checkpoint. Readers also check sizes, headers
 * and CRCs, so a file damaged after the fact is skipped too. One writer per <dir> at a time.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "train.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ckpt.c writes host-order files and assumes a little-endian host"
#endif

#define CKPT_HEADER_INTS 256
#define CKPT_HEADER_BYTES (CKPT_HEADER_INTS * 4)
#define CKPT_MAGIC_MODEL 0x4d544657 /* "WFTM" */
#define CKPT_MAGIC_OPTIM 0x4f544657 /* "WFTO" */
#define CKPT_VERSION 1
#define CKPT_DTYPE_F32 0
#define CKPT_CHUNK (1 << 16) /* bytes per read/write call */
#define CKPT_DIR_MAX (PATH_MAX - 64) /* a step folder's path; room left for the file names */

enum {
    H_MAGIC, H_VERSION, H_L, H_C, H_NH, H_V, H_T, H_E, H_P_LO, H_P_HI, H_DTYPE, H_STEP
};

/* ------------------------------------------------------------------------------------------
 * CRC32 (IEEE 802.3, reflected polynomial 0xEDB88320, as zlib's crc32)
 * ---------------------------------------------------------------------------------------- */
static uint32_t crc_table[256];
static int crc_ready;

static void crc_init(void)
{
    if (crc_ready)
        return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
    crc_ready = 1;
}

/* Running CRC: start from 0, feed every byte of the file in order. */
static uint32_t crc_update(uint32_t crc, const void *data, size_t n)
{
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++)
        crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* ------------------------------------------------------------------------------------------
 * Small file-system helpers
 * ---------------------------------------------------------------------------------------- */
static ncclResult_t fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        WT_ERR("checkpoint: cannot open %s to sync it: %s", path, strerror(errno));
        return ncclSystemError;
    }
    if (fsync(fd) != 0) {
        WT_ERR("checkpoint: fsync %s: %s", path, strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    close(fd);
    return ncclSuccess;
}

/* mkdir -p; syncs the parent of each folder it creates so the new name itself is durable. */
static ncclResult_t make_dirs(const char *dir)
{
    char path[PATH_MAX];
    size_t n = strlen(dir);

    if (n == 0 || n >= sizeof(path)) {
        WT_ERR("checkpoint: bad folder name '%s'", dir);
        return ncclInvalidArgument;
    }
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        char save = path[i];
        path[i] = '\0';
        if (mkdir(path, 0777) == 0) {
            char parent[PATH_MAX];
            const char *slash = strrchr(path, '/');
            if (slash == NULL)
                snprintf(parent, sizeof(parent), ".");
            else if (slash == path)
                snprintf(parent, sizeof(parent), "/");
            else
                snprintf(parent, sizeof(parent), "%.*s", (int)(slash - path), path);
            if (fsync_path(parent) != ncclSuccess)
                return ncclSystemError;
        } else if (errno != EEXIST) {
            WT_ERR("checkpoint: mkdir %s: %s", path, strerror(errno));
            return ncclSystemError;
        }
        path[i] = save;
    }
    return ncclSuccess;
}

/* rm -r of a checkpoint folder (files, and folders of files should anything else appear). */
static int remove_tree(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    int rc = 0;

    if (d == NULL)
        return unlink(path) == 0 || errno == ENOENT ? 0 : -1;
    while ((e = readdir(d)) != NULL) {
        char sub[PATH_MAX];
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name) >= (int)sizeof(sub)) {
            rc = -1;
            continue;
        }
        if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode))
            rc |= remove_tree(sub);
        else if (unlink(sub) != 0 && errno != ENOENT)
            rc = -1;
    }
    closedir(d);
    if (rmdir(path) != 0 && errno != ENOENT)
        rc = -1;
    return rc;
}

static ncclResult_t write_all(int fd, const char *path, const void *data, size_t n, uint32_t *crc)
{
    const char *p = data;
    *crc = crc_update(*crc, data, n);
    while (n > 0) {
        ssize_t k = write(fd, p, n < CKPT_CHUNK ? n : CKPT_CHUNK);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            WT_ERR("checkpoint: write %s: %s", path, k < 0 ? strerror(errno) : "no progress");
            return ncclSystemError;
        }
        p += k;
        n -= (size_t)k;
    }
    return ncclSuccess;
}

/* count floats from src, or zeros when src is NULL. */
static ncclResult_t write_floats(int fd, const char *path, const float *src, size_t count,
                                 uint32_t *crc)
{
    static const float zeros[CKPT_CHUNK / sizeof(float)];
    if (src != NULL)
        return write_all(fd, path, src, count * sizeof(float), crc);
    while (count > 0) {
        size_t k = count < sizeof(zeros) / sizeof(float) ? count : sizeof(zeros) / sizeof(float);
        ncclResult_t res = write_all(fd, path, zeros, k * sizeof(float), crc);
        if (res != ncclSuccess)
            return res;
        count -= k;
    }
    return ncclSuccess;
}

static void fill_header(int32_t *h, int32_t magic, const struct wt_config *cfg, size_t P,
                        int step)
{
    memset(h, 0, CKPT_HEADER_BYTES);
    h[H_MAGIC] = magic;
    h[H_VERSION] = CKPT_VERSION;
    h[H_L] = cfg->layers;
    h[H_C] = cfg->channels;
    h[H_NH] = cfg->heads;
    h[H_V] = cfg->vocab;
    h[H_T] = cfg->seq;
    h[H_E] = cfg->experts;
    h[H_P_LO] = (int32_t)(uint32_t)((uint64_t)P & 0xffffffffu);
    h[H_P_HI] = (int32_t)(uint32_t)((uint64_t)P >> 32);
    h[H_DTYPE] = CKPT_DTYPE_F32;
    h[H_STEP] = step;
}

/* fsync, then close: the data is on disk before the checkpoint is renamed into place. Keeps the
 * first error (res). */
static ncclResult_t sync_close(int fd, const char *path, ncclResult_t res)
{
    if (res == ncclSuccess && fsync(fd) != 0) {
        WT_ERR("checkpoint: fsync %s: %s", path, strerror(errno));
        res = ncclSystemError;
    }
    if (close(fd) != 0 && res == ncclSuccess) {
        WT_ERR("checkpoint: close %s: %s", path, strerror(errno));
        res = ncclSystemError;
    }
    return res;
}

/* Creates (or truncates) path for writing; -1 with the error reported. */
static int create_file(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        WT_ERR("checkpoint: cannot create %s: %s", path, strerror(errno));
    return fd;
}

/* Creates path, writes header + the float arrays, fsyncs. */
static ncclResult_t write_bin(const char *path, const int32_t *hdr, const float *a, const float *b,
                              size_t P, int narrays, uint32_t *crc_p)
{
    uint32_t crc = 0;
    ncclResult_t res;
    int fd = create_file(path);

    if (fd < 0)
        return ncclSystemError;
    res = write_all(fd, path, hdr, CKPT_HEADER_BYTES, &crc);
    if (res == ncclSuccess)
        res = write_floats(fd, path, a, P, &crc);
    if (res == ncclSuccess && narrays > 1)
        res = write_floats(fd, path, b, P, &crc);
    *crc_p = crc;
    return sync_close(fd, path, res);
}

static ncclResult_t write_text(const char *path, const char *text)
{
    uint32_t crc = 0;
    ncclResult_t res;
    int fd = create_file(path);

    if (fd < 0)
        return ncclSystemError;
    res = write_all(fd, path, text, strlen(text), &crc);
    return sync_close(fd, path, res);
}

/* A config whose size computation cannot overflow or divide by zero. */
static int config_sane(const struct wt_config *c)
{
    return c->layers >= 1 && c->layers <= 4096 && c->channels >= 1 && c->channels <= (1 << 16) &&
           c->heads >= 1 && c->channels % c->heads == 0 && c->vocab >= 1 &&
           c->vocab <= (1 << 24) && c->seq >= 1 && c->seq <= (1 << 24) && c->experts >= 0 &&
           c->experts <= 4096;
}

static int config_equal(const struct wt_config *a, const struct wt_config *b)
{
    return a->layers == b->layers && a->channels == b->channels && a->heads == b->heads &&
           a->vocab == b->vocab && a->seq == b->seq && a->experts == b->experts;
}

static void config_str(const struct wt_config *c, char *buf, size_t n)
{
    snprintf(buf, n, "L=%d C=%d NH=%d V=%d T=%d E=%d", c->layers, c->channels, c->heads,
             c->vocab, c->seq, c->experts);
}

/* ------------------------------------------------------------------------------------------
 * Writing
 * ---------------------------------------------------------------------------------------- */
ncclResult_t wt_ckpt_write(const char *dir, int step, const struct wt_config *cfg,
                           const char *layout_desc, const float *params, const float *m,
                           const float *v)
{
    char tmp[CKPT_DIR_MAX], final[CKPT_DIR_MAX], old[CKPT_DIR_MAX], path[PATH_MAX], cfgs[128];
    char *meta;
    size_t P, meta_cap;
    int32_t hdr[CKPT_HEADER_INTS];
    uint32_t crc_model = 0, crc_optim = 0;
    struct stat st;
    int moved_old = 0;
    ncclResult_t res;

    if (dir == NULL || cfg == NULL || params == NULL || step < 0 || !config_sane(cfg)) {
        WT_ERR("checkpoint: bad arguments (dir %s, step %d, config %s)", dir ? dir : "NULL",
               step, cfg && config_sane(cfg) ? "ok" : "invalid");
        return ncclInvalidArgument;
    }
    crc_init();
    P = wt_canon_size(cfg);
    if (snprintf(tmp, sizeof(tmp), "%s/step_%08d.tmp.%ld", dir, step, (long)getpid()) >=
            (int)sizeof(tmp) ||
        snprintf(final, sizeof(final), "%s/step_%08d", dir, step) >= (int)sizeof(final) ||
        snprintf(old, sizeof(old), "%s/step_%08d.old.%ld", dir, step, (long)getpid()) >=
            (int)sizeof(old)) {
        WT_ERR("checkpoint: folder name too long: %s", dir);
        return ncclInvalidArgument;
    }
    WT_CHECK(make_dirs(dir));
    remove_tree(tmp); /* left by an earlier crashed process that had our pid */
    if (mkdir(tmp, 0777) != 0) {
        WT_ERR("checkpoint: mkdir %s: %s", tmp, strerror(errno));
        return ncclSystemError;
    }

    snprintf(path, sizeof(path), "%s/model.bin", tmp);
    fill_header(hdr, CKPT_MAGIC_MODEL, cfg, P, step);
    res = write_bin(path, hdr, params, NULL, P, 1, &crc_model);
    if (res == ncclSuccess) {
        snprintf(path, sizeof(path), "%s/optim.bin", tmp);
        fill_header(hdr, CKPT_MAGIC_OPTIM, cfg, P, step);
        res = write_bin(path, hdr, m, v, P, 2, &crc_optim);
    }
    if (res != ncclSuccess)
        goto fail;

    /* meta.txt: the layout description goes on one line, so newlines in it become spaces. */
    meta_cap = 1024 + (layout_desc ? strlen(layout_desc) : 0);
    meta = malloc(meta_cap);
    if (meta == NULL) {
        WT_ERR("checkpoint: out of memory");
        res = ncclSystemError;
        goto fail;
    }
    {
        int n = snprintf(meta, meta_cap,
                         "format=weft-checkpoint\nversion=%d\nstep=%d\nlayers=%d\nchannels=%d\n"
                         "heads=%d\nvocab=%d\nseq=%d\nexperts=%d\nparams=%zu\ndtype=float32\n"
                         "byte_order=little\nlayout=",
                         CKPT_VERSION, step, cfg->layers, cfg->channels, cfg->heads, cfg->vocab,
                         cfg->seq, cfg->experts, P);
        for (const char *s = layout_desc ? layout_desc : "unknown"; *s; s++)
            meta[n++] = (*s == '\n' || *s == '\r') ? ' ' : *s;
        snprintf(meta + n, meta_cap - (size_t)n, "\nmodel_crc32=%08" PRIx32
                 "\noptim_crc32=%08" PRIx32 "\n", crc_model, crc_optim);
    }
    snprintf(path, sizeof(path), "%s/meta.txt", tmp);
    res = write_text(path, meta);
    free(meta);
    if (res != ncclSuccess)
        goto fail;
    if ((res = fsync_path(tmp)) != ncclSuccess)
        goto fail;

    /* A folder of the same step from an earlier run (complete or torn) is moved aside, so that
     * the rename below cannot fail on a non-empty target; the aside copy is removed at the end,
     * or by prune if we crash first (it never looks like a checkpoint). */
    if (lstat(final, &st) == 0) {
        if (rename(final, old) != 0) {
            WT_ERR("checkpoint: cannot move the old %s aside: %s", final, strerror(errno));
            res = ncclSystemError;
            goto fail;
        }
        moved_old = 1;
    }
    if (rename(tmp, final) != 0) {
        WT_ERR("checkpoint: rename %s -> %s: %s", tmp, final, strerror(errno));
        res = ncclSystemError;
        goto fail;
    }
    if ((res = fsync_path(dir)) != ncclSuccess)
        return res;
    snprintf(path, sizeof(path), "%s/DONE", final);
    snprintf(cfgs, sizeof(cfgs), "step %d\n", step);
    WT_CHECK(write_text(path, cfgs));
    WT_CHECK(fsync_path(final));
    if (moved_old && remove_tree(old) != 0)
        WT_ERR("checkpoint: could not remove %s (prune will retry)", old);
    return ncclSuccess;

fail:
    remove_tree(tmp);
    return res;
}

/* ------------------------------------------------------------------------------------------
 * Checking and reading
 * ---------------------------------------------------------------------------------------- */
struct ckpt_meta {
    struct wt_config cfg;
    long long step, params;
    uint32_t crc_model, crc_optim;
    int have; /* bit mask of the keys found */
};

enum {
    M_STEP = 1 << 0, M_L = 1 << 1, M_C = 1 << 2, M_NH = 1 << 3, M_V = 1 << 4, M_T = 1 << 5,
    M_E = 1 << 6, M_P = 1 << 7, M_CRCM = 1 << 8, M_CRCO = 1 << 9, M_ALL = (1 << 10) - 1
};

static int parse_meta(const char *path, struct ckpt_meta *mt, char *why, size_t wn)
{
    static const struct {
        const char *key;
        int bit;
    } keys[] = {{"step", M_STEP},         {"layers", M_L},       {"channels", M_C},
                {"heads", M_NH},          {"vocab", M_V},        {"seq", M_T},
                {"experts", M_E},         {"params", M_P},       {"model_crc32", M_CRCM},
                {"optim_crc32", M_CRCO}};
    char line[512];
    FILE *f = fopen(path, "re");

    memset(mt, 0, sizeof(*mt));
    if (f == NULL) {
        snprintf(why, wn, "cannot open meta.txt: %s", strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        char *eq = strchr(line, '='), *end;
        long long val;
        size_t ki;
        if (eq == NULL)
            continue;
        *eq = '\0';
        for (ki = 0; ki < sizeof(keys) / sizeof(keys[0]); ki++)
            if (strcmp(line, keys[ki].key) == 0)
                break;
        if (ki == sizeof(keys) / sizeof(keys[0]))
            continue; /* format, layout, ...: informative */
        errno = 0;
        int is_crc = keys[ki].bit == M_CRCM || keys[ki].bit == M_CRCO;
        val = strtoll(eq + 1, &end, is_crc ? 16 : 10);
        if (end == eq + 1 || (*end != '\n' && *end != '\0') || errno != 0 || val < 0 ||
            (is_crc && val > 0xffffffffLL) || (!is_crc && keys[ki].bit != M_P && val > INT_MAX)) {
            snprintf(why, wn, "meta.txt has a bad value for %s", keys[ki].key);
            fclose(f);
            return -1;
        }
        switch (keys[ki].bit) {
        case M_STEP: mt->step = val; break;
        case M_L: mt->cfg.layers = (int)val; break;
        case M_C: mt->cfg.channels = (int)val; break;
        case M_NH: mt->cfg.heads = (int)val; break;
        case M_V: mt->cfg.vocab = (int)val; break;
        case M_T: mt->cfg.seq = (int)val; break;
        case M_E: mt->cfg.experts = (int)val; break;
        case M_P: mt->params = val; break;
        case M_CRCM: mt->crc_model = (uint32_t)val; break;
        case M_CRCO: mt->crc_optim = (uint32_t)val; break;
        }
        mt->have |= keys[ki].bit;
    }
    fclose(f);
    if (mt->have != M_ALL) {
        for (size_t ki = 0; ki < sizeof(keys) / sizeof(keys[0]); ki++)
            if (!(mt->have & keys[ki].bit)) {
                snprintf(why, wn, "meta.txt lacks %s (truncated?)", keys[ki].key);
                break;
            }
        return -1;
    }
    return 0;
}

/*
 * Reads and checks one .bin file: size, header against (cfg, P, step, magic), and CRC against
 * `crc`. The narrays float arrays of P elements go to out[i] when not NULL. Returns 0, or -1 with
 * the reason in why.
 */
static int read_bin(const char *path, const char *name, int32_t magic, const struct wt_config *cfg,
                    size_t P, int step, uint32_t want_crc, int narrays, float *const *out,
                    char *why, size_t wn)
{
    int32_t hdr[CKPT_HEADER_INTS], ref[CKPT_HEADER_INTS];
    uint64_t expect = CKPT_HEADER_BYTES + (uint64_t)narrays * P * sizeof(float);
    uint32_t crc = 0;
    struct stat st;
    char *chunk = NULL;
    int rc = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        snprintf(why, wn, "cannot open %s: %s", name, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        snprintf(why, wn, "cannot stat %s: %s", name, strerror(errno));
        goto out;
    }
    if ((uint64_t)st.st_size != expect) {
        snprintf(why, wn, "%s is %lld bytes, expected %" PRIu64 " (truncated or wrong size)", name,
                 (long long)st.st_size, expect);
        goto out;
    }
    chunk = malloc(CKPT_CHUNK);
    if (chunk == NULL) {
        snprintf(why, wn, "out of memory");
        goto out;
    }
    fill_header(ref, magic, cfg, P, step);
    for (int a = -1; a < narrays; a++) {
        /* a == -1: the header; then each array, streamed in chunks. */
        uint64_t left = a < 0 ? CKPT_HEADER_BYTES : (uint64_t)P * sizeof(float);
        char *dst = a < 0 ? (char *)hdr : (out[a] ? (char *)out[a] : NULL);
        while (left > 0) {
            size_t want = left < CKPT_CHUNK ? (size_t)left : CKPT_CHUNK;
            char *buf = dst ? dst : chunk;
            ssize_t k = read(fd, buf, want);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                snprintf(why, wn, "%s: read: %s", name, k < 0 ? strerror(errno) : "short file");
                goto out;
            }
            crc = crc_update(crc, buf, (size_t)k);
            if (dst)
                dst += k;
            left -= (uint64_t)k;
        }
        if (a < 0 && memcmp(hdr, ref, CKPT_HEADER_BYTES) != 0) {
            if (hdr[H_MAGIC] != magic || hdr[H_VERSION] != CKPT_VERSION)
                snprintf(why, wn, "%s: bad magic/version 0x%x/%d", name, (unsigned)hdr[H_MAGIC],
                         hdr[H_VERSION]);
            else
                snprintf(why, wn, "%s: header (config, size, dtype or step %d) does not match "
                         "meta.txt", name, hdr[H_STEP]);
            goto out;
        }
    }
    if (crc != want_crc) {
        snprintf(why, wn, "%s: CRC32 %08" PRIx32 " does not match meta.txt's %08" PRIx32, name,
                 crc, want_crc);
        goto out;
    }
    rc = 0;
out:
    free(chunk);
    close(fd);
    return rc;
}

/*
 * Checks checkpoint `step` completely (DONE, meta, sizes, headers, CRCs) and, with non-NULL
 * buffers, loads it. want: the config the caller expects, or NULL. On failure returns the error
 * class with the reason in why (buffers then hold undefined data).
 */
static ncclResult_t ckpt_load(const char *dir, int step, const struct wt_config *want,
                              float *params, float *m, float *v, char *why, size_t wn)
{
    char sdir[CKPT_DIR_MAX], path[PATH_MAX], a[128], b[128];
    struct ckpt_meta mt;
    struct stat st;
    size_t P;

    crc_init();
    if (snprintf(sdir, sizeof(sdir), "%s/step_%08d", dir, step) >= (int)sizeof(sdir)) {
        snprintf(why, wn, "path too long");
        return ncclInvalidArgument;
    }
    snprintf(path, sizeof(path), "%s/DONE", sdir);
    if (stat(path, &st) != 0) {
        if (stat(sdir, &st) != 0)
            snprintf(why, wn, "no such checkpoint (%s)", strerror(errno));
        else
            snprintf(why, wn, "no DONE marker (an interrupted write)");
        return ncclSystemError;
    }
    snprintf(path, sizeof(path), "%s/meta.txt", sdir);
    if (parse_meta(path, &mt, why, wn) != 0)
        return ncclSystemError;
    if (mt.step != step) {
        snprintf(why, wn, "meta.txt says step %lld", mt.step);
        return ncclSystemError;
    }
    if (!config_sane(&mt.cfg)) {
        config_str(&mt.cfg, a, sizeof(a));
        snprintf(why, wn, "meta.txt has an invalid config (%s)", a);
        return ncclSystemError;
    }
    if (want != NULL && !config_equal(want, &mt.cfg)) {
        config_str(&mt.cfg, a, sizeof(a));
        config_str(want, b, sizeof(b));
        snprintf(why, wn, "it holds a different model (%s) than this run's (%s)", a, b);
        return ncclInvalidArgument;
    }
    P = wt_canon_size(&mt.cfg);
    if ((unsigned long long)mt.params != (unsigned long long)P) {
        snprintf(why, wn, "meta.txt says %lld parameters, the config has %zu", mt.params, P);
        return ncclSystemError;
    }
    snprintf(path, sizeof(path), "%s/model.bin", sdir);
    float *model_out[1] = {params};
    if (read_bin(path, "model.bin", CKPT_MAGIC_MODEL, &mt.cfg, P, step, mt.crc_model, 1,
                 model_out, why, wn) != 0)
        return ncclSystemError;
    snprintf(path, sizeof(path), "%s/optim.bin", sdir);
    float *optim_out[2] = {m, v};
    if (read_bin(path, "optim.bin", CKPT_MAGIC_OPTIM, &mt.cfg, P, step, mt.crc_optim, 2,
                 optim_out, why, wn) != 0)
        return ncclSystemError;
    return ncclSuccess;
}

ncclResult_t wt_ckpt_read(const char *dir, int step, const struct wt_config *cfg, float *params,
                          float *m, float *v)
{
    char why[512];
    ncclResult_t res;

    if (dir == NULL || cfg == NULL || step < 0) {
        WT_ERR("checkpoint: bad arguments to wt_ckpt_read");
        return ncclInvalidArgument;
    }
    res = ckpt_load(dir, step, cfg, params, m, v, why, sizeof(why));
    if (res != ncclSuccess)
        WT_ERR("checkpoint %s/step_%08d cannot be used: %s", dir, step, why);
    return res;
}

/* Step of a name "step_<8 or more digits>", or -1 (.tmp/.old folders and anything else). */
static int step_of_name(const char *name)
{
    const char *p = name + 5;
    long long v = 0;
    int digits = 0;

    if (strncmp(name, "step_", 5) != 0)
        return -1;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        v = v * 10 + (*p - '0');
        if (v > INT_MAX)
            return -1;
    }
    return *p == '\0' && digits >= 8 ? (int)v : -1;
}

static int stale_name(const char *name)
{
    return strncmp(name, "step_", 5) == 0 &&
           (strstr(name, ".tmp.") != NULL || strstr(name, ".old.") != NULL);
}

static int cmp_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The steps of <dir>'s step_N folders, newest first; count in *n (0 when dir is absent). */
static int *list_steps(const char *dir, int *n)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int *steps = NULL, cap = 0;

    *n = 0;
    if (d == NULL)
        return NULL;
    while ((e = readdir(d)) != NULL) {
        int s = step_of_name(e->d_name);
        if (s < 0)
            continue;
        if (*n == cap) {
            int *grown = realloc(steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof(int));
            if (grown == NULL)
                break;
            steps = grown;
        }
        steps[(*n)++] = s;
    }
    closedir(d);
    if (*n > 1)
        qsort(steps, (size_t)*n, sizeof(int), cmp_desc);
    return steps;
}

int wt_ckpt_latest(const char *dir)
{
    int n, found = -1;
    int *steps;

    if (dir == NULL)
        return -1;
    steps = list_steps(dir, &n);
    for (int i = 0; i < n && found < 0; i++) {
        char why[512];
        if (ckpt_load(dir, steps[i], NULL, NULL, NULL, NULL, why, sizeof(why)) == ncclSuccess)
            found = steps[i];
        else
            WT_ERR("checkpoint: skipping %s/step_%08d: %s", dir, steps[i], why);
    }
    free(steps);
    return found;
}

void wt_ckpt_prune(const char *dir, int keep)
{
    int n, kept = 0, oldest_kept = -1;
    int *steps;
    DIR *d;
    struct dirent *e;

    if (dir == NULL || keep <= 0)
        return;
    /* Count only checkpoints that check out completely, newest first, so that a torn or corrupt
     * newer one never causes the last good one to be deleted. */
    steps = list_steps(dir, &n);
    for (int i = 0; i < n && kept < keep; i++) {
        char why[512];
        if (ckpt_load(dir, steps[i], NULL, NULL, NULL, NULL, why, sizeof(why)) == ncclSuccess) {
            kept++;
            oldest_kept = steps[i];
        }
    }
    for (int i = 0; i < n && kept == keep; i++) {
        char path[PATH_MAX];
        if (steps[i] >= oldest_kept)
            continue;
        snprintf(path, sizeof(path), "%s/step_%08d", dir, steps[i]);
        if (remove_tree(path) != 0)
            WT_ERR("checkpoint: could not remove %s", path);
    }
    free(steps);
    /* Folders of interrupted writes (.tmp.<pid>) and replaced copies (.old.<pid>). */
    d = opendir(dir);
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        char path[PATH_MAX];
        if (!stale_name(e->d_name))
            continue;
        if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path))
            continue;
        if (remove_tree(path) != 0)
            WT_ERR("checkpoint: could not remove %s", path);
    }
    closedir(d);
}
