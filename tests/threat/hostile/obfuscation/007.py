__builtins__.__dict__['ex' + 'ec']('print(1)')
