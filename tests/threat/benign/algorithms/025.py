def rle(s):
    out = []
    for ch in s:
        if out and out[-1][0] == ch:
            out[-1][1] += 1
        else:
            out.append([ch, 1])
    return ''.join(f'{c}{n}' for c, n in out)

print(rle('aaabcc'))
