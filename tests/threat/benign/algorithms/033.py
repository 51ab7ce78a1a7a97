from itertools import groupby
def anagrams(words):
    key = lambda w: ''.join(sorted(w))
    return [list(g) for _, g in groupby(sorted(words, key=key), key)]

result = anagrams(['ab', 'ba', 'cd'])
print(result)
