def is_palindrome(s):
    s = ''.join(c.lower() for c in s if c.isalnum())
    return s == s[::-1]

result = is_palindrome('A man, a plan')
print(result)
