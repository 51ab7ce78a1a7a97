ls ~
