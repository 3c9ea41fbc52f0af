/* mesh.c: not written yet */
