/* dp.c: not written yet */
