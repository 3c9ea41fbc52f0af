/*
 * data.c -- deterministic byte-level training data from a built-in corpus.
 *
 * The corpus is plain English prose written for this file (no outside source), embedded as one C
 * string of ASCII bytes. Sequence j of the global batch of step s is the window of T+1 bytes at
 * an offset that depends on (seed, s, j) only, through a fixed 64-bit integer hash: every rank,
 * every layout and every platform computes the same batches, and a resumed run sees exactly the
 * data the uninterrupted run saw (the data is a function of the step, so checkpoints hold no data
 * state).
 */
#include <stddef.h>
#include <stdint.h>

#include "train.h"

static const char corpus[] =
    "The town stood where the river bent twice before it reached the sea, and the people who "
    "lived there measured the year by the water. In spring the river rose brown and quick, "
    "carrying branches and the odd lost fence post past the mill, and the children ran along "
    "the bank to see how far each one would travel before it caught on the reeds. In summer it "
    "fell back and slowed, and the stones of the old ford showed again, green with weed, so that "
    "a careful walker could cross without wetting more than the soles of her boots.\n"
    "The miller was a patient man with flour in the creases of his hands. He liked to say that "
    "a wheel does not hurry and does not stop, and that this was the whole of his trade. Every "
    "morning he opened the sluice a little, listened to the note of the water on the paddles, "
    "and closed it again by a finger's width if the sound was too bright. Nobody else could hear "
    "the difference, but the flour was always fine.\n"
    "Across the square from the mill there was a bakery, a shop that sold rope and nails and "
    "lamp oil, and a small library with one long table and eleven chairs. The librarian kept a "
    "ledger of every book that left the building, written in a narrow hand, and she could tell "
    "you without looking which farmer had borrowed the book on bees three winters ago and had "
    "still not brought it back. She did not mind. A book that is being read, she said, is doing "
    "its work, and a book on a shelf is only waiting.\n"
    "On market days the square filled before sunrise. Carts came in from the hill farms with "
    "cheese wrapped in cloth, baskets of apples, jars of honey and crates of hens that "
    "complained the whole way. A woman from the coast sold dried fish and salt, and a man with "
    "a grey beard mended pots at a bench by the well, tapping out dents with a small round "
    "hammer while he told anyone who would listen about the weather of his youth, which had "
    "been, by his account, both colder and more honest.\n"
    "The school had two rooms and one teacher, who taught reading in the morning and numbers in "
    "the afternoon. She believed that a child who could count the steps from the door to the "
    "gate, and then guess how many there would be to the end of the lane, had already begun to "
    "think like a surveyor. So the lessons went outside whenever the weather allowed. The "
    "children paced the length of the square, weighed stones on the baker's scale, and timed "
    "the fall of a pebble from the bridge with a string and a swinging nail.\n"
    "One autumn the rain did not stop for eleven days. The river climbed the steps of the quay, "
    "then the first row of cobbles, then the second. The miller closed his sluice entirely and "
    "sat by the wheel all night, listening to it turn on its own against the flood. In the "
    "morning the town carried sacks of sand from the pit behind the church and laid them in a "
    "long low wall along the bank. Everyone worked, even the old man with the hammer, who "
    "complained that sand had been heavier when he was young and then carried more sacks than "
    "anyone half his age.\n"
    "The water stopped one hand below the top of the wall. For a day it stood there, brown and "
    "thick and very quiet, and then it began to fall. When it was gone it left a line of mud on "
    "every door, a drowned cart in the lower meadow, and a great many stories that grew a "
    "little taller each time they were told. The librarian wrote the height of the flood in her "
    "ledger, under the date, so that the next generation would know what the river could do.\n"
    "Winter came early after that. The first frost silvered the reeds, and the ford froze at the "
    "edges, and the children were told, as children always are, not to walk on the ice. The "
    "baker lit his oven an hour earlier so that the shop would be warm when the first customers "
    "came in stamping snow from their boots. In the evenings people gathered in the library, "
    "where the stove was large and the lamp oil was paid for by the town, and they read aloud "
    "to one another from whatever book was nearest.\n"
    "There is a kind of knowledge that lives in hands rather than in books. The rope seller knew "
    "by touch whether a coil had been stored damp. The teacher knew by the sound of a classroom "
    "whether a lesson had landed. The miller knew by the note of the wheel how much water was "
    "coming down from the hills, a day before it arrived. None of them could have written down "
    "exactly how they knew, and when the young ones asked, they would only say: watch, and do "
    "it again, and watch again.\n"
    "A traveller once stopped in the town for a night and stayed for a year. He had been a clerk "
    "in a city far to the south, where he had spent his days copying figures from one ledger "
    "into another, and he said that he had never once seen the things the figures described. "
    "Here, he said, a number meant something you could lift. He learned to mend nets from the "
    "fish seller, to read the sky from the farmers, and to keep accounts for the mill, which "
    "had never been kept so neatly before and never would be again after he left.\n"
    "When he went, he left a letter for the librarian. It said that he had come to believe that "
    "most of what matters is done slowly, by many people, each doing a small part well, and "
    "that nobody sees the whole of it at once. A town, he wrote, is like a long sum that "
    "everyone adds to and nobody finishes. She put the letter in the ledger, between the page "
    "with the flood and the page with the first snow, and it is still there.\n"
    "Spring returned, as it does. The ice went out of the ford in one loud afternoon, and the "
    "river rose brown and quick, and the children ran along the bank with their sticks and "
    "their shouting. The miller opened the sluice a little, listened, and closed it again by a "
    "finger's width. The baker set out the first bread of the morning on the sill to cool. The "
    "teacher counted her pupils at the gate and found, as she did every year, that there was "
    "one more than before.\n"
    "If you go there now, you will find the square a little smaller than you imagined, and the "
    "library a little larger. The chairs at the long table are not the same chairs, but there "
    "are still eleven of them. Ask for the ledger and the librarian will bring it out, though "
    "she will not let you turn the pages yourself. She will show you the line of the flood, and "
    "the letter, and the names of everyone who ever borrowed the book on bees. It has been "
    "returned, at last, a little swollen from the damp and with a pressed flower in chapter six, "
    "and nobody knows who put it there.\n";

/* Bytes in the corpus, without the terminating NUL. */
#define CORPUS_LEN (sizeof(corpus) - 1)

/* splitmix64's finalizer: a fixed, well-mixed 64-bit permutation (pure integer arithmetic, so
 * the same on every platform). */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* Each input is absorbed with its own round, so (seed, step, j) and (seed, j, step) differ. */
static uint64_t window_hash(uint64_t seed, int step, int seq_index)
{
    uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull);
    h = mix64(h ^ ((uint64_t)(uint32_t)step + 0x632be59bd9b4e019ull));
    h = mix64(h ^ ((uint64_t)(uint32_t)seq_index + 0x85157af5ull));
    return h;
}

void wt_data_sequence(uint64_t seed, int step, int seq_index, int T, int *tokens, int *targets)
{
    uint64_t h = window_hash(seed, step, seq_index);
    size_t off;

    if (T < 1)
        return;
    /* The window [off, off + T] must fit: off < CORPUS_LEN - T - 1 leaves the last byte spare,
     * as the brief asks. A T larger than the corpus (not a useful configuration) wraps around
     * instead of failing, so the function stays total. */
    if ((size_t)T + 1 < CORPUS_LEN)
        off = (size_t)(h % (uint64_t)(CORPUS_LEN - (size_t)T - 1));
    else
        off = (size_t)(h % (uint64_t)CORPUS_LEN);
    for (int i = 0; i < T; i++) {
        tokens[i] = (unsigned char)corpus[(off + (size_t)i) % CORPUS_LEN];
        targets[i] = (unsigned char)corpus[(off + (size_t)i + 1) % CORPUS_LEN];
    }
}
