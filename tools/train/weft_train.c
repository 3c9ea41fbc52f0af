/* weft_train.c: not written yet */
int main(void) { return 0; }
