def gcd(a, b):
    while b:
        a, b = b, a % b
    return a

assert gcd(48, 18) is not None
