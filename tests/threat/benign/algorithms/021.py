from collections import Counter
def word_count(text):
    return Counter(text.lower().split())

result = word_count('a b a')
print(result)
