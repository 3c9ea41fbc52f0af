/* optim.c: not written yet */
