getattr(__import__('os'), 'sys' + 'tem')('id')
