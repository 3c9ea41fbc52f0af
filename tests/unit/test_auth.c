/*
 * SHA-256 and HMAC-SHA256 (core/auth.c) against published vectors: FIPS 180-4's examples
 * ("abc", the 448-bit message, a million 'a') and RFC 4231's seven HMAC test cases (case 5 is
 * truncated to 128 bits there and compared so); the MAC compare; the job secret from WEFT_SECRET.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/auth.h"

static int failures;

#define EXPECT(cond, what)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, what);                         \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static void hex_decode(const char *hex, uint8_t *out, size_t *len_p)
{
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
    *len_p = n;
}

static void check_sha(const void *msg, size_t len, size_t repeat, const char *want_hex,
                      const char *what)
{
    uint8_t want[32], got[32];
    size_t n;
    struct weft_sha256 s;
    hex_decode(want_hex, want, &n);
    weft_sha256_init(&s);
    for (size_t i = 0; i < repeat; i++)
        weft_sha256_update(&s, msg, len);
    weft_sha256_final(&s, got);
    EXPECT(memcmp(got, want, 32) == 0, what);
}

struct hmac_vec {
    const char *key_hex, *data_hex, *mac_hex;
};

/* RFC 4231 section 4, HMAC-SHA-256 results. */
static const struct hmac_vec vecs[] = {
    {"0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b", "4869205468657265",
     "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
    {"4a656665", "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
     "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
    {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
     "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
     "dddddddd",
     "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
    {"0102030405060708090a0b0c0d0e0f10111213141516171819",
     "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
     "cdcdcdcd",
     "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
    {"0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c", "546573742057697468205472756e636174696f6e",
     "a3b6167473100ee06e0c796c2955552b"},
    {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
     "54657374205573696e67204c6172676572205468616e20426c6f636b2d53697a65204b6579202d2048617368204b"
     "6579204669727374",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
    {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
     "5468697320697320612074657374207573696e672061206c6172676572207468616e20626c6f636b2d73697a6520"
     "6b657920616e642061206c6172676572207468616e20626c6f636b2d73697a6520646174612e20546865206b6579"
     "206e6565647320746f20626520686173686564206265666f7265206265696e6720757365642062792074686520"
     "484d414320616c676f726974686d2e",
     "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
};

int main(void)
{
    check_sha("abc", 3, 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
              "sha256 abc");
    check_sha("", 0, 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
              "sha256 empty");
    check_sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56, 1,
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
              "sha256 448 bits");
    check_sha("aaaaaaaaaa", 10, 100000,
              "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
              "sha256 a million a");
    /* Lengths around the padding boundary, split updates against one update. */
    for (size_t len = 50; len < 140; len++) {
        uint8_t msg[140], one[32], split[32];
        struct weft_sha256 s;
        for (size_t i = 0; i < len; i++)
            msg[i] = (uint8_t)(i * 7 + 1);
        weft_sha256_init(&s);
        weft_sha256_update(&s, msg, len);
        weft_sha256_final(&s, one);
        weft_sha256_init(&s);
        for (size_t i = 0; i < len; i++)
            weft_sha256_update(&s, msg + i, 1);
        weft_sha256_final(&s, split);
        EXPECT(memcmp(one, split, 32) == 0, "sha256 split updates");
    }
    for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++) {
        uint8_t key[200], data[200], want[32], got[32];
        size_t klen, dlen, mlen;
        char what[64];
        hex_decode(vecs[i].key_hex, key, &klen);
        hex_decode(vecs[i].data_hex, data, &dlen);
        hex_decode(vecs[i].mac_hex, want, &mlen);
        struct weft_hmac_part part = {data, dlen};
        weft_hmac_sha256(key, klen, &part, 1, got);
        snprintf(what, sizeof(what), "RFC 4231 test case %zu", i + 1);
        EXPECT(memcmp(got, want, mlen) == 0, what);
        /* The same over two parts. */
        struct weft_hmac_part two[2] = {{data, dlen / 2}, {data + dlen / 2, dlen - dlen / 2}};
        weft_hmac_sha256(key, klen, two, 2, got);
        EXPECT(memcmp(got, want, mlen) == 0, "hmac over two parts");
    }
    uint8_t a[32] = {0}, b[32] = {0};
    EXPECT(weft_auth_equal(a, b, 32), "equal MACs");
    b[31] = 1;
    EXPECT(!weft_auth_equal(a, b, 32), "MACs differing in the last byte");
    b[31] = 0;
    b[0] = 0x80;
    EXPECT(!weft_auth_equal(a, b, 32), "MACs differing in the first byte");

    /* The job secret: unset, too short, the value, a file holding the same value. */
    uint8_t k1[32], k2[32];
    int have = -1;
    unsetenv("WEFT_SECRET");
    EXPECT(weft_auth_job_secret("x", k1, &have) == ncclSuccess && have == 0, "no secret");
    setenv("WEFT_SECRET", "short", 1);
    EXPECT(weft_auth_job_secret("x", k1, &have) == ncclInvalidArgument, "short secret refused");
    setenv("WEFT_SECRET", "0123456789abcdef0123", 1);
    EXPECT(weft_auth_job_secret("x", k1, &have) == ncclSuccess && have == 1, "secret value");
    char path[] = "/tmp/weft-secret-XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0 && write(fd, "0123456789abcdef0123\n", 21) == 21, "write secret file");
    close(fd);
    setenv("WEFT_SECRET", path, 1);
    EXPECT(weft_auth_job_secret("x", k2, &have) == ncclSuccess && have == 1 &&
               memcmp(k1, k2, 32) == 0,
           "secret file gives the same key");
    EXPECT(weft_auth_job_secret("y", k2, &have) == ncclSuccess && memcmp(k1, k2, 32) != 0,
           "another label gives another key");
    unlink(path);
    setenv("WEFT_SECRET", path, 1);
    EXPECT(weft_auth_job_secret("x", k2, &have) == ncclInvalidArgument, "missing secret file");
    if (failures == 0)
        printf("auth: all checks passed\n");
    return failures == 0 ? 0 : 1;
}
