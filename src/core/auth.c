/* SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104) and the job secret; see auth.h. */
#include "core/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "core/check.h"
#include "core/param.h"

/* Listed by weft-info -e; read with weft_param_lookup so the value is never cached or logged. */
WEFT_PARAM_STR(Secret, "WEFT_SECRET", NULL,
               "job secret that every connection of a communicator made from NCCL_COMM_ID, and "
               "the launch store, must prove it knows (the value, or a file when it starts with "
               "'/'; at least 16 bytes); unset: anyone who reaches the port can join, as with "
               "NCCL");

static const uint32_t weft_sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t weft_ror(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

static void weft_sha256_block(struct weft_sha256 *s, const uint8_t *p)
{
    uint32_t w[64], a[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = weft_ror(w[i - 15], 7) ^ weft_ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = weft_ror(w[i - 2], 17) ^ weft_ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(a, s->h, sizeof(a));
    for (int i = 0; i < 64; i++) {
        uint32_t e = a[4];
        uint32_t t1 = a[7] + (weft_ror(e, 6) ^ weft_ror(e, 11) ^ weft_ror(e, 25)) +
                      ((e & a[5]) ^ (~e & a[6])) + weft_sha256_k[i] + w[i];
        uint32_t t2 = (weft_ror(a[0], 2) ^ weft_ror(a[0], 13) ^ weft_ror(a[0], 22)) +
                      ((a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]));
        memmove(a + 1, a, 7 * sizeof(a[0]));
        a[4] += t1;
        a[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++)
        s->h[i] += a[i];
}

void weft_sha256_init(struct weft_sha256 *s)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof(h0));
    s->bytes = 0;
    s->fill = 0;
}

void weft_sha256_update(struct weft_sha256 *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    s->bytes += len;
    while (len > 0) {
        size_t n = 64 - s->fill < len ? 64 - s->fill : len;
        memcpy(s->buf + s->fill, p, n);
        s->fill += n;
        p += n;
        len -= n;
        if (s->fill == 64) {
            weft_sha256_block(s, s->buf);
            s->fill = 0;
        }
    }
}

void weft_sha256_final(struct weft_sha256 *s, uint8_t out[32])
{
    uint64_t bits = s->bytes * 8;
    uint8_t pad[72] = {0x80};
    size_t padlen = (s->fill < 56 ? 56 : 120) - s->fill;
    for (int i = 0; i < 8; i++)
        pad[padlen + i] = (uint8_t)(bits >> (56 - 8 * i));
    weft_sha256_update(s, pad, padlen + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

void weft_hmac_sha256(const void *key, size_t key_len, const struct weft_hmac_part *parts,
                      int nparts, uint8_t out[WEFT_AUTH_MAC_BYTES])
{
    uint8_t k[64] = {0}, pad[64], inner[32];
    struct weft_sha256 s;
    if (key_len > 64) { /* RFC 2104: longer keys are hashed first */
        weft_sha256_init(&s);
        weft_sha256_update(&s, key, key_len);
        weft_sha256_final(&s, k);
    } else if (key_len > 0) {
        memcpy(k, key, key_len);
    }
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x36;
    weft_sha256_init(&s);
    weft_sha256_update(&s, pad, 64);
    for (int i = 0; i < nparts; i++)
        weft_sha256_update(&s, parts[i].data, parts[i].len);
    weft_sha256_final(&s, inner);
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x5c;
    weft_sha256_init(&s);
    weft_sha256_update(&s, pad, 64);
    weft_sha256_update(&s, inner, sizeof(inner));
    weft_sha256_final(&s, out);
}

int weft_auth_equal(const void *a, const void *b, size_t n)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;
    for (size_t i = 0; i < n; i++)
        d |= x[i] ^ y[i];
    return d == 0;
}

void weft_auth_mac(const uint8_t key[WEFT_AUTH_KEY_BYTES], const char *label,
                   const uint8_t nonce_server[WEFT_AUTH_NONCE_BYTES],
                   const uint8_t nonce_client[WEFT_AUTH_NONCE_BYTES], const void *msg,
                   size_t msg_len, uint8_t mac[WEFT_AUTH_MAC_BYTES])
{
    struct weft_hmac_part parts[4] = {{label, strlen(label) + 1},
                                      {nonce_server, WEFT_AUTH_NONCE_BYTES},
                                      {nonce_client, WEFT_AUTH_NONCE_BYTES},
                                      {msg, msg_len}};
    weft_hmac_sha256(key, WEFT_AUTH_KEY_BYTES, parts, 4, mac);
}

ncclResult_t weft_auth_random(void *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = getrandom((char *)buf + done, len - done, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            WEFT_WARN("call to getrandom failed: %s", strerror(errno));
            return ncclSystemError;
        }
        done += (size_t)n;
    }
    return ncclSuccess;
}

#define WEFT_SECRET_MAX 4096
#define WEFT_SECRET_MIN 16

ncclResult_t weft_auth_job_secret(const char *label, uint8_t key[WEFT_AUTH_KEY_BYTES],
                                  int *have_p)
{
    char buf[WEFT_SECRET_MAX];
    const char *v = weft_param_lookup("WEFT_SECRET");
    size_t len;
    if (v == NULL || v[0] == '\0') {
        memset(key, 0, WEFT_AUTH_KEY_BYTES);
        *have_p = 0;
        return ncclSuccess;
    }
    if (v[0] == '/') {
        int fd = open(v, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf));
        int err = errno;
        if (fd >= 0)
            close(fd);
        if (n < 0) {
            WEFT_WARN("WEFT_SECRET names the file %s, which cannot be read: %s", v, strerror(err));
            return ncclInvalidArgument;
        }
        len = (size_t)n;
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
            len--;
    } else {
        len = strlen(v);
        if (len > sizeof(buf))
            len = sizeof(buf);
        memcpy(buf, v, len);
    }
    if (len < WEFT_SECRET_MIN) {
        WEFT_WARN("WEFT_SECRET holds %zu bytes; a secret needs at least %d", len, WEFT_SECRET_MIN);
        return ncclInvalidArgument;
    }
    struct weft_hmac_part part = {label, strlen(label)};
    weft_hmac_sha256(buf, len, &part, 1, key);
    memset(buf, 0, sizeof(buf));
    *have_p = 1;
    return ncclSuccess;
}
