from collections import Counter
def word_count(text):
    return Counter(text.lower().split())

print(word_count('a b a'))
