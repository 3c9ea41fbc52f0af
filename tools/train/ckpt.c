/* ckpt.c: not written yet */
