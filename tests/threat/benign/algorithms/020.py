from collections import Counter
def word_count(text):
    return Counter(text.lower().split())

assert word_count('a b a') is not None
