/*
 * test_util.c -- the training layer's data and checkpoint helpers (tools/train/data.c, ckpt.c).
 *
 *   test_util CASE     runs one case; exits 0 (pass) or 1 (fail) with a message per failure.
 *
 * Cases: data-determinism, data-range, data-golden, ckpt-roundtrip, ckpt-mismatch, ckpt-torn,
 * ckpt-overwrite, ckpt-prune. Checkpoint cases work in a fresh folder under $TMPDIR (or /tmp)
 * that they remove when they pass.
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
#include <unistd.h>

#include "train.h"

static int failures;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                       \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* ------------------------------------------------------------------------------------------
 * Data
 * ---------------------------------------------------------------------------------------- */
static uint64_t fnv1a_ints(const int *v, int n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint64_t)(uint32_t)v[i]) * 0x100000001b3ull;
    return h;
}

static void case_data_determinism(void)
{
    enum { T = 64 };
    int a_tok[T], a_tgt[T], b_tok[T], b_tgt[T];
    uint64_t seen[400];
    int distinct = 0;

    for (int step = 0; step < 50; step++) {
        for (int j = 0; j < 8; j++) {
            wt_data_sequence(42, step, j, T, a_tok, a_tgt);
            wt_data_sequence(42, step, j, T, b_tok, b_tgt);
            EXPECT(memcmp(a_tok, b_tok, sizeof(a_tok)) == 0, "step %d seq %d tokens", step, j);
            EXPECT(memcmp(a_tgt, b_tgt, sizeof(a_tgt)) == 0, "step %d seq %d targets", step, j);
            uint64_t h = fnv1a_ints(a_tok, T);
            int dup = 0;
            for (int k = 0; k < distinct; k++)
                dup |= seen[k] == h;
            if (!dup)
                seen[distinct++] = h;
        }
    }
    /* 400 windows of 64 bytes in a corpus of some KiB: nearly all start at different offsets. */
    EXPECT(distinct >= 380, "only %d distinct windows of 400", distinct);

    /* The seed, the step and the index each change the window; (s, j) and (j, s) differ. */
    int c_tok[T], c_tgt[T];
    wt_data_sequence(42, 3, 5, T, a_tok, a_tgt);
    wt_data_sequence(43, 3, 5, T, b_tok, b_tgt);
    wt_data_sequence(42, 5, 3, T, c_tok, c_tgt);
    EXPECT(memcmp(a_tok, b_tok, sizeof(a_tok)) != 0, "seed does not change the window");
    EXPECT(memcmp(a_tok, c_tok, sizeof(a_tok)) != 0, "step and index are interchangeable");
}

static void case_data_range(void)
{
    static const int Ts[] = {1, 2, 16, 64, 256, 1024};
    int *tok = malloc(1024 * sizeof(int)), *tgt = malloc(1024 * sizeof(int));

    for (size_t ti = 0; ti < sizeof(Ts) / sizeof(Ts[0]); ti++) {
        int T = Ts[ti];
        for (int step = 0; step < 200; step++) {
            for (int j = 0; j < 4; j++) {
                wt_data_sequence(7, step, j, T, tok, tgt);
                for (int i = 0; i < T; i++) {
                    /* Byte ids of plain ASCII text: printable or newline. */
                    int ok = (tok[i] >= 32 && tok[i] < 127) || tok[i] == '\n';
                    EXPECT(ok, "T %d step %d seq %d: token %d = %d", T, step, j, i, tok[i]);
                    ok = (tgt[i] >= 32 && tgt[i] < 127) || tgt[i] == '\n';
                    EXPECT(ok, "T %d step %d seq %d: target %d = %d", T, step, j, i, tgt[i]);
                    /* targets are the next bytes: the window is T+1 consecutive bytes. */
                    if (i + 1 < T)
                        EXPECT(tgt[i] == tok[i + 1], "T %d: target %d != token %d", T, i, i + 1);
                }
                if (failures > 20)
                    goto out;
            }
        }
    }
out:
    free(tok);
    free(tgt);
}

/* Fixed values: the data must be the same on every platform and in every later build, or runs
 * and checkpoints stop being comparable. Update only on purpose (and say so in the log). */
static void case_data_golden(void)
{
    enum { T = 64 };
    int tok[T], tgt[T];
    char text[T + 1];

    wt_data_sequence(1234, 7, 3, T, tok, tgt);
    for (int i = 0; i < T; i++)
        text[i] = (char)tok[i];
    text[T] = '\0';
    uint64_t h1 = fnv1a_ints(tok, T), h2 = fnv1a_ints(tgt, T);
    printf("window (1234, 7, 3): \"%s\"\n", text);
    EXPECT(strcmp(text, "le, listened, and closed it again by a finger's width. The baker") == 0,
           "window text changed");
    printf("hashes %016" PRIx64 " %016" PRIx64 "\n", h1, h2);
    EXPECT(h1 == UINT64_C(0x125fd6d8ddf7e6a7), "token hash changed: %016" PRIx64, h1);
    EXPECT(h2 == UINT64_C(0xf821cbac228866ff), "target hash changed: %016" PRIx64, h2);
}

/* ------------------------------------------------------------------------------------------
 * Checkpoints
 * ---------------------------------------------------------------------------------------- */
static const struct wt_config cfg_small = {
    .layers = 2, .channels = 16, .heads = 2, .vocab = 256, .seq = 8, .experts = 0};
static const struct wt_config cfg_moe = {
    .layers = 1, .channels = 8, .heads = 2, .vocab = 256, .seq = 4, .experts = 2};

static char root[1024]; /* the case's folder */

static void make_root(const char *name)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof(root), "%s/weft-ckpt-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
    if (mkdtemp(root) == NULL) {
        fprintf(stderr, "mkdtemp %s: %s\n", root, strerror(errno));
        exit(1);
    }
}

static void rm_rf(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    if (d == NULL) {
        unlink(path);
        return;
    }
    while ((e = readdir(d)) != NULL) {
        char sub[PATH_MAX + 256];
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        rm_rf(sub);
    }
    closedir(d);
    rmdir(path);
}

static void finish_root(void)
{
    if (failures == 0)
        rm_rf(root);
    else
        fprintf(stderr, "checkpoint folder kept for inspection: %s\n", root);
}

/* Deterministic values with sign, small and large magnitudes, and the step folded in. */
static void fill(float *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * (float)(1 << (x & 7));
    }
    if (n > 2) {
        p[0] = -0.0f;
        p[1] = 1e-40f; /* subnormal: must come back bit for bit */
    }
}

struct state {
    size_t P;
    float *params, *m, *v;
};

static struct state state_new(const struct wt_config *cfg, uint32_t seed)
{
    struct state s;
    s.P = wt_canon_size(cfg);
    s.params = malloc(s.P * sizeof(float));
    s.m = malloc(s.P * sizeof(float));
    s.v = malloc(s.P * sizeof(float));
    fill(s.params, s.P, seed);
    fill(s.m, s.P, seed + 1000);
    fill(s.v, s.P, seed + 2000);
    return s;
}

static void state_free(struct state *s)
{
    free(s->params);
    free(s->m);
    free(s->v);
}

static int write_state(const struct wt_config *cfg, int step, const struct state *s)
{
    return wt_ckpt_write(root, step, cfg, "dp=2 tp=1 pp=1 zero=1 microbatches=1", s->params, s->m,
                         s->v) == ncclSuccess;
}

/* 1 if checkpoint `step` reads back equal to s. */
static int reads_as(const struct wt_config *cfg, int step, const struct state *s)
{
    struct state r = {.P = s->P};
    int ok;
    r.params = malloc(s->P * sizeof(float));
    r.m = malloc(s->P * sizeof(float));
    r.v = malloc(s->P * sizeof(float));
    ok = wt_ckpt_read(root, step, cfg, r.params, r.m, r.v) == ncclSuccess &&
         memcmp(r.params, s->params, s->P * sizeof(float)) == 0 &&
         memcmp(r.m, s->m, s->P * sizeof(float)) == 0 &&
         memcmp(r.v, s->v, s->P * sizeof(float)) == 0;
    state_free(&r);
    return ok;
}

static void path_of(char *out, size_t n, int step, const char *file)
{
    if (file)
        snprintf(out, n, "%s/step_%08d/%s", root, step, file);
    else
        snprintf(out, n, "%s/step_%08d", root, step);
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Bitwise CRC32 (zlib's), independent of ckpt.c's table. */
static uint32_t crc32_file(const char *path, long *size)
{
    FILE *f = fopen(path, "rb");
    uint32_t crc = 0xffffffffu;
    int c;
    *size = 0;
    if (f == NULL)
        return 0;
    while ((c = fgetc(f)) != EOF) {
        crc ^= (uint32_t)c;
        for (int k = 0; k < 8; k++)
            crc = (crc & 1) ? 0xedb88320u ^ (crc >> 1) : crc >> 1;
        (*size)++;
    }
    fclose(f);
    return ~crc;
}

static int meta_has(int step, const char *line)
{
    char path[PATH_MAX + 64], buf[1024];
    FILE *f;
    int found = 0;
    path_of(path, sizeof(path), step, "meta.txt");
    f = fopen(path, "r");
    if (f == NULL)
        return 0;
    while (fgets(buf, sizeof(buf), f) != NULL) {
        buf[strcspn(buf, "\n")] = '\0';
        found |= strcmp(buf, line) == 0;
    }
    fclose(f);
    return found;
}

static void case_ckpt_roundtrip(void)
{
    const struct wt_config *cfgs[2] = {&cfg_small, &cfg_moe};

    make_root("roundtrip");
    EXPECT(wt_ckpt_latest(root) == -1, "empty folder has a latest checkpoint");
    for (int c = 0; c < 2; c++) {
        char sub[sizeof(root) + 32];
        char saved[sizeof(root)];
        snprintf(saved, sizeof(saved), "%s", root);
        /* The folder is created when missing, with its parents. */
        snprintf(sub, sizeof(sub), "%s/cfg%d/deeper", saved, c);
        if (snprintf(root, sizeof(root), "%s", sub) >= (int)sizeof(root))
            EXPECT(0, "folder name too long: %s", sub);
        struct state s = state_new(cfgs[c], 17 + (uint32_t)c);
        EXPECT(write_state(cfgs[c], 5, &s), "write");
        EXPECT(wt_ckpt_latest(root) == 5, "latest %d", wt_ckpt_latest(root));
        EXPECT(reads_as(cfgs[c], 5, &s), "round trip of config %d is not bit-exact", c);

        /* File sizes and CRCs, computed here independently, against meta.txt. */
        char path[PATH_MAX + 64], line[128];
        long size;
        uint32_t crc;
        path_of(path, sizeof(path), 5, "model.bin");
        crc = crc32_file(path, &size);
        EXPECT(size == 1024 + (long)(4 * s.P), "model.bin is %ld bytes", size);
        snprintf(line, sizeof(line), "model_crc32=%08" PRIx32, crc);
        EXPECT(meta_has(5, line), "meta.txt lacks %s", line);
        path_of(path, sizeof(path), 5, "optim.bin");
        crc = crc32_file(path, &size);
        EXPECT(size == 1024 + (long)(8 * s.P), "optim.bin is %ld bytes", size);
        snprintf(line, sizeof(line), "optim_crc32=%08" PRIx32, crc);
        EXPECT(meta_has(5, line), "meta.txt lacks %s", line);
        EXPECT(meta_has(5, "layout=dp=2 tp=1 pp=1 zero=1 microbatches=1"), "layout line");
        snprintf(line, sizeof(line), "params=%zu", s.P);
        EXPECT(meta_has(5, line), "meta.txt lacks %s", line);

        /* The header: magic, version, config, P as two halves, dtype. */
        int32_t hdr[256];
        FILE *f;
        path_of(path, sizeof(path), 5, "model.bin");
        f = fopen(path, "rb");
        EXPECT(f && fread(hdr, 4, 256, f) == 256, "header read");
        if (f)
            fclose(f);
        EXPECT(hdr[2] == cfgs[c]->layers && hdr[3] == cfgs[c]->channels &&
                   hdr[4] == cfgs[c]->heads && hdr[5] == cfgs[c]->vocab &&
                   hdr[6] == cfgs[c]->seq && hdr[7] == cfgs[c]->experts,
               "header config");
        EXPECT((size_t)(uint32_t)hdr[8] + ((size_t)(uint32_t)hdr[9] << 32) == s.P, "header P");
        EXPECT(hdr[10] == 0, "dtype %d", hdr[10]);

        /* m and v may be NULL on write (zeros) and on read (not loaded). */
        EXPECT(wt_ckpt_write(root, 6, cfgs[c], NULL, s.params, NULL, NULL) == ncclSuccess,
               "write without optimizer state");
        float *p2 = malloc(s.P * sizeof(float)), *m2 = malloc(s.P * sizeof(float));
        EXPECT(wt_ckpt_read(root, 6, cfgs[c], p2, m2, NULL) == ncclSuccess, "read of step 6");
        EXPECT(memcmp(p2, s.params, s.P * sizeof(float)) == 0, "params of step 6");
        int zero = 1;
        for (size_t i = 0; i < s.P; i++)
            zero &= m2[i] == 0.0f;
        EXPECT(zero, "m of a checkpoint written without it is not zero");
        EXPECT(wt_ckpt_read(root, 5, cfgs[c], p2, NULL, NULL) == ncclSuccess, "params only");
        EXPECT(wt_ckpt_latest(root) == 6, "latest %d", wt_ckpt_latest(root));
        free(p2);
        free(m2);
        state_free(&s);
        snprintf(root, sizeof(root), "%s", saved);
    }
    finish_root();
}

static void case_ckpt_mismatch(void)
{
    struct state s;
    struct wt_config other = cfg_small;

    make_root("mismatch");
    s = state_new(&cfg_small, 3);
    EXPECT(write_state(&cfg_small, 1, &s), "write");
    other.layers = 3;
    EXPECT(wt_ckpt_read(root, 1, &other, s.params, s.m, s.v) == ncclInvalidArgument,
           "a different model config must be ncclInvalidArgument");
    other = cfg_small;
    other.experts = 2;
    EXPECT(wt_ckpt_read(root, 1, &other, s.params, s.m, s.v) == ncclInvalidArgument,
           "different experts");
    EXPECT(wt_ckpt_read(root, 2, &cfg_small, s.params, s.m, s.v) != ncclSuccess,
           "a step that does not exist");
    state_free(&s);
    finish_root();
}

static void truncate_file(int step, const char *file, long keep)
{
    char path[PATH_MAX + 64];
    path_of(path, sizeof(path), step, file);
    if (truncate(path, keep) != 0)
        fprintf(stderr, "truncate %s: %s\n", path, strerror(errno));
}

static void flip_byte(int step, const char *file, long at)
{
    char path[PATH_MAX + 64];
    unsigned char b;
    path_of(path, sizeof(path), step, file);
    int fd = open(path, O_RDWR);
    if (fd < 0 || pread(fd, &b, 1, at) != 1) {
        fprintf(stderr, "flip %s: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return;
    }
    b ^= 0x10;
    if (pwrite(fd, &b, 1, at) != 1)
        fprintf(stderr, "flip %s: %s\n", path, strerror(errno));
    close(fd);
}

/* Each way a write can be torn (or a file damaged) leaves the older complete checkpoint latest. */
static void case_ckpt_torn(void)
{
    struct state good = state_new(&cfg_small, 1), bad = state_new(&cfg_small, 2);
    char path[PATH_MAX + 64];
    long modelsize = 1024 + (long)(4 * good.P);

    make_root("torn");
    EXPECT(write_state(&cfg_small, 10, &good), "write step 10");

    static const char *const kinds[] = {
        "no DONE", "model.bin truncated", "optim.bin truncated", "bad CRC in model params",
        "bad CRC in optim v", "model header damaged", "meta.txt truncated", "meta.txt missing",
        "model.bin missing"};
    for (int k = 0; k < (int)(sizeof(kinds) / sizeof(kinds[0])); k++) {
        int step = 20 + k;
        EXPECT(write_state(&cfg_small, step, &bad), "write step %d", step);
        switch (k) {
        case 0: path_of(path, sizeof(path), step, "DONE"); unlink(path); break;
        case 1: truncate_file(step, "model.bin", modelsize - 4); break;
        case 2: truncate_file(step, "optim.bin", 1024 + 100); break;
        case 3: flip_byte(step, "model.bin", 1024 + 4 * 7 + 1); break;
        case 4: flip_byte(step, "optim.bin", 1024 + 8 * (long)good.P - 3); break;
        case 5: flip_byte(step, "model.bin", 4 * 3); break;
        case 6: truncate_file(step, "meta.txt", 40); break;
        case 7: path_of(path, sizeof(path), step, "meta.txt"); unlink(path); break;
        case 8: path_of(path, sizeof(path), step, "model.bin"); unlink(path); break;
        }
        fprintf(stderr, "-- torn checkpoint %d: %s (a message should name it)\n", step,
                kinds[k]);
        int latest = wt_ckpt_latest(root);
        EXPECT(latest == 10, "%s: latest is %d, expected 10", kinds[k], latest);
        EXPECT(wt_ckpt_read(root, step, &cfg_small, bad.params, bad.m, bad.v) != ncclSuccess,
               "%s: reading it must fail", kinds[k]);
        fill(bad.params, bad.P, 2);
        fill(bad.m, bad.P, 1002);
        fill(bad.v, bad.P, 2002);
        /* Leave it there: the next kind adds a newer torn one above it. */
    }

    /* A folder of an interrupted write, complete inside (DONE and all), is never a checkpoint. */
    char from[PATH_MAX + 64], to[PATH_MAX + 64];
    EXPECT(write_state(&cfg_small, 50, &bad), "write step 50");
    path_of(from, sizeof(from), 50, NULL);
    snprintf(to, sizeof(to), "%s/step_%08d.tmp.%d", root, 60, 99999);
    EXPECT(rename(from, to) == 0, "rename");
    EXPECT(wt_ckpt_latest(root) == 10, "a .tmp folder was taken as a checkpoint");
    /* Nor are other names near the pattern. */
    snprintf(to, sizeof(to), "%s/step_123", root);
    mkdir(to, 0777);
    snprintf(to, sizeof(to), "%s/step_00000070x", root);
    mkdir(to, 0777);
    EXPECT(wt_ckpt_latest(root) == 10, "a misnamed folder was taken as a checkpoint");

    EXPECT(reads_as(&cfg_small, 10, &good), "the complete checkpoint does not read back");

    /* prune keeps the good one (the only complete one) and clears the .tmp folder; the torn ones
     * are newer and stay (harmless: latest skips them, a new write of their step replaces them).
     */
    wt_ckpt_prune(root, 1);
    snprintf(to, sizeof(to), "%s/step_%08d.tmp.%d", root, 60, 99999);
    EXPECT(!exists(to), "prune left the .tmp folder");
    EXPECT(wt_ckpt_latest(root) == 10, "prune removed the last good checkpoint");

    /* Rewriting a torn step replaces it with a complete one. */
    EXPECT(write_state(&cfg_small, 20, &good), "rewrite step 20");
    EXPECT(wt_ckpt_latest(root) == 20, "latest after rewrite: %d", wt_ckpt_latest(root));
    EXPECT(reads_as(&cfg_small, 20, &good), "rewritten step 20");
    state_free(&good);
    state_free(&bad);
    finish_root();
}

/* Writing a step that exists already (e.g. a resumed run passing the same step) replaces it, and
 * leaves no .old or .tmp folder behind. */
static void case_ckpt_overwrite(void)
{
    struct state a = state_new(&cfg_small, 5), b = state_new(&cfg_small, 6);
    DIR *d;
    struct dirent *e;
    int entries = 0;

    make_root("overwrite");
    EXPECT(write_state(&cfg_small, 3, &a), "write a");
    EXPECT(write_state(&cfg_small, 3, &b), "write b");
    EXPECT(reads_as(&cfg_small, 3, &b), "step 3 is not the second write");
    d = opendir(root);
    while (d && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') {
            entries++;
            EXPECT(strcmp(e->d_name, "step_00000003") == 0, "left behind: %s", e->d_name);
        }
    if (d)
        closedir(d);
    EXPECT(entries == 1, "%d entries", entries);
    state_free(&a);
    state_free(&b);
    finish_root();
}

static void case_ckpt_prune(void)
{
    struct state s = state_new(&cfg_small, 9);
    char path[PATH_MAX + 64];

    make_root("prune");
    for (int step = 1; step <= 6; step++)
        EXPECT(write_state(&cfg_small, step * 100, &s), "write %d", step * 100);
    snprintf(path, sizeof(path), "%s/step_%08d.tmp.%d", root, 700, 4242);
    mkdir(path, 0777);
    snprintf(path, sizeof(path), "%s/step_%08d.old.%d", root, 300, 4243);
    mkdir(path, 0777);
    snprintf(path, sizeof(path), "%s/unrelated.txt", root);
    fclose(fopen(path, "w"));

    wt_ckpt_prune(root, 0); /* keep <= 0: no pruning of checkpoints */
    path_of(path, sizeof(path), 100, NULL);
    EXPECT(exists(path), "keep 0 pruned a checkpoint");

    wt_ckpt_prune(root, 3);
    for (int step = 1; step <= 6; step++) {
        path_of(path, sizeof(path), step * 100, NULL);
        EXPECT(exists(path) == (step >= 4), "step %d: exists %d", step * 100, exists(path));
    }
    snprintf(path, sizeof(path), "%s/step_%08d.tmp.%d", root, 700, 4242);
    EXPECT(!exists(path), "stale .tmp kept");
    snprintf(path, sizeof(path), "%s/step_%08d.old.%d", root, 300, 4243);
    EXPECT(!exists(path), "stale .old kept");
    snprintf(path, sizeof(path), "%s/unrelated.txt", root);
    EXPECT(exists(path), "prune removed a file that is not its own");
    EXPECT(wt_ckpt_latest(root) == 600, "latest %d", wt_ckpt_latest(root));

    /* A corrupt newest checkpoint does not count towards `keep`: the good ones stay. */
    flip_byte(600, "optim.bin", 2000);
    wt_ckpt_prune(root, 2);
    path_of(path, sizeof(path), 400, NULL);
    EXPECT(exists(path), "prune counted a corrupt checkpoint as kept");
    path_of(path, sizeof(path), 500, NULL);
    EXPECT(exists(path), "step 500 removed");
    EXPECT(wt_ckpt_latest(root) == 500, "latest %d", wt_ckpt_latest(root));
    /* Fewer good checkpoints than keep: nothing is removed. */
    wt_ckpt_prune(root, 10);
    path_of(path, sizeof(path), 400, NULL);
    EXPECT(exists(path), "prune with keep > count removed one");
    wt_ckpt_prune(root, 1);
    path_of(path, sizeof(path), 400, NULL);
    EXPECT(!exists(path), "keep 1 left step 400");
    EXPECT(wt_ckpt_latest(root) == 500, "latest %d", wt_ckpt_latest(root));
    state_free(&s);
    finish_root();
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {{"data-determinism", case_data_determinism},
                 {"data-range", case_data_range},
                 {"data-golden", case_data_golden},
                 {"ckpt-roundtrip", case_ckpt_roundtrip},
                 {"ckpt-mismatch", case_ckpt_mismatch},
                 {"ckpt-torn", case_ckpt_torn},
                 {"ckpt-overwrite", case_ckpt_overwrite},
                 {"ckpt-prune", case_ckpt_prune}};
    int ran = 0;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0)
            continue;
        cases[i].fn();
        ran++;
    }
    if (ran == 0) {
        fprintf(stderr, "usage: %s [CASE]; unknown case %s\n", argv[0], argv[1]);
        return 2;
    }
    if (failures)
        fprintf(stderr, "%d failure%s\n", failures, failures == 1 ? "" : "s");
    else
        printf("PASS\n");
    return failures ? 1 : 0;
}
