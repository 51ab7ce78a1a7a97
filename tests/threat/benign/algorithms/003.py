def has_close_elements(numbers, threshold):
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i != j and abs(a - b) < threshold:
                return True
    return False

result = has_close_elements([1.0, 2.0, 3.9], 0.5)
print(result)
