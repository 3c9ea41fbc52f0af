/*
 * Authentication of every connection a communicator accepts (bootstrap root, rank to rank
 * bootstrap links, the launch store, the socket transport): SHA-256 (FIPS 180-4) and HMAC-SHA256
 * (RFC 2104), written here so that libnccl.so.2 links no crypto library, plus the job secret.
 *
 * Challenge-response, used alike by every protocol: the accepting side sends a random nonce
 * first; the connecting side answers with its own nonce and HMAC(key, label "client" part, both
 * nonces, the message it sends); the accepting side checks it (in constant time) before it
 * admits anything, and proves itself with HMAC(key, label "server" part, both nonces, its reply).
 * The key never travels; a replayed answer fails against a fresh nonce; neither a fake server nor
 * a fake client learns anything it could reuse. There is no encryption of the traffic after the
 * handshake (as with NCCL): an attacker who can rewrite packets on the path is not covered.
 *
 * All functions are pure and thread-safe except weft_auth_random (getrandom) and
 * weft_auth_job_secret (reads WEFT_SECRET once per call).
 */
#ifndef WEFT_CORE_AUTH_H
#define WEFT_CORE_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#define WEFT_AUTH_KEY_BYTES 32
#define WEFT_AUTH_MAC_BYTES 32
#define WEFT_AUTH_NONCE_BYTES 16

/* The two nonces of one connection's handshake. */
struct weft_auth_nonces {
    uint8_t server[WEFT_AUTH_NONCE_BYTES];
    uint8_t client[WEFT_AUTH_NONCE_BYTES];
};

struct weft_sha256 {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t buf[64];
    size_t fill;
};

void weft_sha256_init(struct weft_sha256 *s);
void weft_sha256_update(struct weft_sha256 *s, const void *data, size_t len);
void weft_sha256_final(struct weft_sha256 *s, uint8_t out[32]);

/* HMAC-SHA256 over the concatenation of n (pointer, length) parts; a key of any length. */
struct weft_hmac_part {
    const void *data;
    size_t len;
};
void weft_hmac_sha256(const void *key, size_t key_len, const struct weft_hmac_part *parts,
                      int nparts, uint8_t out[WEFT_AUTH_MAC_BYTES]);

/* 1 when the n bytes are equal; the time taken does not depend on where they differ. */
int weft_auth_equal(const void *a, const void *b, size_t n);

/*
 * The MAC of one handshake message: HMAC(key, label, nonce_server, nonce_client, msg). label names
 * the protocol and the direction ("bs-hello", "bs-reply", ...), so an answer of one kind is never
 * accepted as another.
 */
void weft_auth_mac(const uint8_t key[WEFT_AUTH_KEY_BYTES], const char *label,
                   const uint8_t nonce_server[WEFT_AUTH_NONCE_BYTES],
                   const uint8_t nonce_client[WEFT_AUTH_NONCE_BYTES], const void *msg,
                   size_t msg_len, uint8_t mac[WEFT_AUTH_MAC_BYTES]);

/* Fills buf with len bytes from getrandom (ncclSystemError if it fails). */
ncclResult_t weft_auth_random(void *buf, size_t len);

/*
 * The job secret from WEFT_SECRET: the value itself, or, when it starts with '/', the contents of
 * that file (a trailing newline dropped). Writes key = HMAC(secret, label): *have_p = 1. Unset or
 * empty: key all zero, *have_p = 0 (nothing is authenticated then). ncclInvalidArgument when the
 * file cannot be read or the secret has fewer than 16 bytes.
 */
ncclResult_t weft_auth_job_secret(const char *label, uint8_t key[WEFT_AUTH_KEY_BYTES],
                                  int *have_p);

#endif
