/* pp.c: not written yet */
