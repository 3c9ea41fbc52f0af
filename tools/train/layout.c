/* layout.c: not written yet */
