"""The lexical kind: the analyzer, BM25 and its variants, block-max MaxScore, the vocabulary."""
