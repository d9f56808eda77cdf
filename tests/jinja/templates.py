"""templates.py: the chat templates tests/jinja/jinjacmp.py renders with Jinja2 and with
sparkmono's C renderer (written for these tests in the style of the Llama-3, ChatML and
Mistral templates and of the tool-calling ChatML ones, plus templates that exercise every
supported construct; the model families' templates are in families.py), one-line templates
of every built-in (BUILTINS, rendered over BUILTIN_VARS), the integer overflows the C renderer
must refuse where Python's integers grow (OVERFLOWS), and the templates the C renderer must
refuse at load (the construct named, its line and column)."""

CHATML = """{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"""

LLAMA3 = """{% set loop_messages = messages %}
{% for message in loop_messages %}
    {% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}
    {% if loop.index0 == 0 %}
        {% set content = bos_token + content %}
    {% endif %}
    {{ content }}
{% endfor %}
{% if add_generation_prompt %}
    {{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{% endif %}"""

MISTRAL = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

# namespace, macros with defaults and keyword arguments, loop variables, tests, filters, methods
KITCHEN = """{#- a template that uses every supported construct -#}
{%- macro header(role, sep=': ', upper=false) -%}
{{ role | upper if upper else role | capitalize }}{{ sep }}
{%- endmacro -%}
{%- set ns = namespace(system='', n_user=0, last_user=-1) -%}
{%- for m in messages -%}
  {%- if m.role == 'system' -%}{%- set ns.system = m.content -%}
  {%- elif m.role == 'user' -%}{%- set ns.n_user = ns.n_user + 1 -%}{%- set ns.last_user = loop.index0 -%}
  {%- endif -%}
{%- endfor -%}
{{ bos_token }}
{% if ns.system %}
SYSTEM {{ ns.system | length }} chars: {{ ns.system.strip() }}
{% endif %}
{% for m in messages if m.role != 'system' %}
  {{ loop.index }}/{{ loop.length }} rev{{ loop.revindex }},{{ loop.revindex0 }}{% if loop.first %} first{% endif %}{% if loop.last %} last{% endif %}
  {% if loop.previtem is defined %} prev={{ loop.previtem.role }}{% endif %}{% if loop.nextitem is defined %} next={{ loop.nextitem.role }}{% endif %}

{{ header(m.role) }}{{ m.content }}
{{ header(m.role, upper=true, sep=' > ') -}}
{{ m.content.lstrip().rstrip() | replace('\\n', ' / ') }}|{{ m.content.split() | join(',') }}|{{ m['content'].startswith('Hi') }}|{{ m.content.endswith('?') }}
  {%- if m.content is string and m.content | length > 10 %} long{% else %} short{% endif %}
  {%- if loop.index0 == ns.last_user %} (last user turn){% endif %}

{% else %}
(no turns)
{% endfor %}
{% set words = messages | map(attribute='role') | list %}
roles={{ words | join(' ') }} first={{ words | first }} last={{ words | last }} n={{ words | count }}
users={{ messages | selectattr('role', 'equalto', 'user') | list | length }} others={{ messages | rejectattr('role', 'equalto', 'user') | list | length }}
{{ messages[-1].content[:5] }}|{{ messages[-1].content[::-1] }}|{{ messages[0].content[1:-1:2] }}|{{ 'abc'[::-1] }}
{{ (1 + 2 * 3 - 4) // 2 }} {{ 7 % 3 }} {{ 2 / 4 }} {{ -3 // 2 }} {{ 'a' ~ 1 ~ none ~ true }} {{ [1, 2] + [3] }} {{ 'ab' * 2 }}
{{ 'héllo' | first }}{{ 'héllo' | last }}{{ 'hé' | list }}{{ 'héllo' | length }}{% for ch in 'hé' %}[{{ ch }}]{% endfor %} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 3 > 2 >= 2 }} {{ 1 < 2 > 3 }} {{ '\\u00e9\\x41\\t\\101' }} {% for k, v in {'b': 1, 'A': 2} | dictsort %}{{ k }}{{ v }}{% endfor %}
{{ 1 < 2 and 2 >= 2 or false }} {{ not 1 == 2 }} {{ 'x' in 'xyz' }} {{ 'q' not in ['a', 'b'] }} {{ 'role' in messages[0] }}
{{ none is none }} {{ 1 is number }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is string }} {{ undefined_thing is defined }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }}
{{ undefined_thing | default('dflt') }} {{ '' | default('empty', true) }} {{ 42 | string }} {{ '7' | int + 1 }} {{ 3.5 | int }} {{ 'hello world' | title }} {{ 'ABC' | lower }}
{{ {'k': 'v', 'n': [1, 2.5, none, true]} | tojson }} {{ messages[0] | tojson }} {{ {'a': {'b': 'ü "q"'}} | tojson(indent=2) }} {{ {'b': 1, 'a': {'d': [1, 2], 'c': 2}} | tojson(sort_keys=true) }} {{ {'x': [1, 2]} | tojson(separators=(',', ':')) }} {{ {'z': 1, 'y': 2} | tojson(indent=1, sort_keys=true) }} {{ {'é': 'ü 日本 😀'} | tojson(ensure_ascii=true) }} {{ messages[0].content | tojson(true) }}
{% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}={{ v }}{{ ', ' if not loop.last }}{% endfor %}
{% for k, v in {'p': 'q'} | items %}{{ k }}:{{ v }}{% endfor %} {{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b', 'none!') }} {{ {'a': 1}.get('b') }}
{% for i in range(3) %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %} {% for i in range(10) %}{% if i > 2 %}{% break %}{% endif %}{{ i }}{% endfor %}
{% set block %}inner {{ messages | length }}{% endset %}{{ block | trim }} {{ 'line1\\nline2\\n\\nline4' | indent(2) }}
{{ 'a' if false }}{{ 'b' if true else 'c' }} {{ [3, 1, 2] | reverse | list }} {{ [none, 1.0, 1e20, 0.1 + 0.2, -0.0] }} {{ "it's" }} {{ ['it\\'s', "q\\"d"] }}
{% if add_generation_prompt %}<|assistant|>
{% endif %}"""

# whitespace control and the environment's trim_blocks / lstrip_blocks
WHITESPACE = """{% if true +%}
kept newline{% endif %}
  {% if true %}
    indented text
  {% endif %}
{# a comment #}
after comment
{%+ if true %}kept{% endif %}
   {{- ' joined' }}
{% for m in messages %}
    {%- if loop.first -%}
        FIRST {{ m.role }}
    {%- endif %}

  [{{ m.content }}]  {#- no space #}
{% endfor -%}
   tail {{- ' end' -}}
   !
"""

# Jinja2's default Undefined: a missing key is undefined (empty, false), an attribute of it an error
UNDEFINED = """{{ messages[0].nothing }}|{{ messages[0].nothing is defined }}|{{ nothing is defined }}|{{ nothing | length }}
{%- for x in nothing %}never{% else %} empty loop{% endfor %}|{{ nothing | default('d') }}|{{ messages[0].get('nothing') }}
{%- if messages | length > 2 %}{{ messages[0].nothing.deeper }}{% endif %}"""

# In the style of the tool-calling ChatML templates (Hermes, Qwen): the tools' JSON in the
# system turn, an assistant's tool_calls (arguments a JSON string or an object), runs of tool
# messages folded into one user turn.  Rendered over conversations with tools (TOOL_CASES).
TOOLS = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nCall one as <tool_call>{\\"name\\": ..., \\"arguments\\": ...}</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' ~ message.content ~ '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}"""

# raw blocks, comments, block set and filter blocks under the same whitespace rules
BLOCKS = r"""{%- raw -%}  {{ x }}  {%- endraw -%}   |{% raw %}a{% endraw %}|{%+ raw %}  b{% endraw +%}
c
   {% raw %}
   r {{ y }}
   {% endraw %}
{# comment #}   {#- stripped -#}   x  {#+ not a modifier +#}y
  {% if true %}
  indented
  {% endif %}
  {%- if true %}   tight {% endif -%}   
  {{ 'v' }}  {% if true +%}
keep{% endif %}
	{% for i in [1, 2] -%}
	  item {{ i }}
	{%- endfor %}
end{#
multi-line comment
#}
{% set x %}
  block
{% endset %}[{{ x }}]
{%- filter upper -%}
  low
{%- endfilter %}
   {%+ if true %}plus{% endif %}
{{ messages | length }}"""

TEMPLATES = {"undefined": UNDEFINED, "chatml": CHATML, "llama3": LLAMA3, "mistral": MISTRAL, "kitchen": KITCHEN,
             "whitespace": WHITESPACE, "blocks": BLOCKS}
TOOL_TEMPLATES = {"tools": TOOLS}

# One-line templates of the built-ins: filters, tests, str / dict / list / loop methods,
# operators, % and format(), tuples, scoping, macros (each rendered over BUILTIN_VARS; an
# error on one side must be an error on the other).
BUILTINS = [t for t in r"""
{{ s|lower }}|{{ s|upper }}|{{ s|title }}|{{ s|capitalize }}
{{ s.lower() }}|{{ s.upper() }}|{{ s.title() }}|{{ s.capitalize() }}|{{ s.swapcase() }}
{{ "they're bill's friends from the UK"|title }}|{{ "they're bill's"|title }}|{{ "they're bill's".title() }}
{{ 'Ä'|lower }}{{ 'straße'|upper }}{{ 'ΣΑΣ ΣΑΣ.'|lower }}{{ 'Σ'|lower }}{{ 'aΣ b'|lower }}
{{ w|trim }}|{{ w.strip() }}|{{ w.lstrip() }}|{{ w.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'äöhiöä'.strip('äö') }}|{{ '\u3000hi\u00a0'.strip() }}
{{ t.split(',') }}{{ t.split(',', 1) }}{{ t.rsplit(',', 1) }}{{ w.split() }}{{ ' a  b  c '.split(None, 1) }}{{ ' a  b  c '.rsplit(None, 1) }}{{ 'a\nb\r\nc\x0bd'.splitlines() }}{{ 'a\nb\n'.splitlines(true) }}
{{ 'hello'.startswith('he') }}{{ 'hello'.startswith(('x', 'hel')) }}{{ 'hello'.endswith(('lo',)) }}{{ 'hello'.startswith('l', 2) }}{{ 'hello'.endswith('l', 0, 4) }}
{{ 'banana'.count('a') }}{{ 'banana'.count('an') }}{{ 'aaa'.count('aa') }}{{ 'abc'.count('') }}{{ 'banana'.find('na') }}{{ 'banana'.rfind('na') }}{{ 'banana'.find('x') }}{{ 'ünïcödé'.find('c') }}{{ 'aaa'.rfind('aa') }}
{{ 'banana'.index('x') }}
{{ 'a-b-c'.replace('-', '+') }}{{ 'a-b-c'.replace('-', '+', 1) }}{{ 'abc'.replace('', '.') }}{{ 'äb'|replace('', '|') }}{{ 'aaa'|replace('a', 'b', 2) }}
{{ '{} and {}'.format(1, 'two') }}|{{ '{1}{0}'.format('a', 'b') }}|{{ '{x}-{y!r}'.format(x=1, y='q') }}|{{ '{:>6}|{:<6}|{:^6}|{:*^7}'.format('ab', 'cd', 'ef', 'gh') }}|{{ '{:05d}|{:+d}|{:,}|{:x}|{:#b}'.format(42, 5, 1234567, 255, 5) }}|{{ '{:.2f}|{:e}|{:g}|{:.3}|{:%}'.format(3.14159, 12345.678, 0.0001, 100.0, 0.25) }}|{{ '{0[a]}|{0.b}'.format(d) }}|{{ '{{}}'.format() }}
{{ '%s|%r|%d|%5.1f|%-4s|%04d|%x|%X|%o|%#x|%#o|%e|%g|%c|%%' % ('a', 'b', 3.9, 2.25, 'z', -5, 255, 255, 8, 255, 8, 1234.5, 0.00001, 65) }}
{{ '%(a)s+%(b)s' % d }}|{{ '%s' % none }}|{{ '%s' % [1, 2] }}|{{ '%.3s|' % 'abcdef' }}
{{ 'hi' % 5 }}
{{ "%s"|format(3) }}{{ "%s-%s"|format(1, 2) }}{{ "%(x)s"|format(x=5) }}
{{ ', '.join(['a', 'b']) }}{{ ''.join(sl) }}{{ '-'.join(d) }}{{ '.'.join('xyz') }}
{{ ', '.join([1]) }}
{{ 'x'.join('abc') }}|{{ 'a=b=c'.partition('=') }}{{ 'a=b=c'.rpartition('=') }}{{ 'abc'.partition('x') }}|{{ 'prefix_x'.removeprefix('prefix_') }}{{ 'x.py'.removesuffix('.py') }}
{{ '42'.isdigit() }}{{ '²'.isdigit() }}{{ 'abc'.isalpha() }}{{ 'ab1'.isalnum() }}{{ ' \t'.isspace() }}{{ ''.isspace() }}{{ 'abc'.islower() }}{{ 'ABC'.isupper() }}{{ 'Ab Cd'.istitle() }}{{ 'ß'.islower() }}{{ 'ª'.islower() }}
{{ 'ab'.center(7) }}|{{ 'ab'.center(8, '*') }}|{{ 'ab'.ljust(5, '-') }}|{{ 'ab'.rjust(5) }}|{{ '-42'.zfill(6) }}|{{ 'ab'|center(9) }}|
{{ l|sort }}{{ l|sort(reverse=true) }}{{ sl|sort }}{{ sl|sort(case_sensitive=true) }}{{ sl|sort(reverse=true) }}{{ users|sort(attribute='age')|map(attribute='name')|join(',') }}{{ users|sort(attribute='name')|map(attribute='name')|list }}
{{ l|unique|list }}{{ sl|unique|list }}{{ sl|unique(case_sensitive=true)|list }}{{ users|unique(attribute='age')|map(attribute='name')|list }}
{{ l|min }}{{ l|max }}{{ sl|min }}{{ sl|max }}{{ sl|max(case_sensitive=true) }}{{ users|min(attribute='age') }}{{ users|max(attribute='age') }}{{ e|min }}
{{ l|sum }}{{ users|sum(attribute='age') }}{{ [1.5, 2]|sum }}{{ l|sum(start=10) }}{{ [[1], [2]]|sum(start=[]) }}
{{ f|round }}{{ f|round(2) }}{{ 2.5|round }}{{ 3.5|round }}{{ 7|round }}{{ 1234|round(-2) }}{{ 1250|round(-2) }}{{ 1350|round(-2) }}{{ 2.7|round(method='floor') }}{{ 2.1|round(method='ceil') }}{{ 2.675|round(2, 'floor') }}{{ -2.5|round }}{{ 0.125|round(2) }}{{ 1234.5|round(-1) }}
{{ neg|abs }}{{ -2.5|abs }}{{ '3'|int + 1 }}{{ ' 42 '|int }}{{ '4.7'|int }}{{ 'x'|int }}{{ 'x'|int(-1) }}{{ 4.9|int }}{{ '1_000'|int }}{{ none|int }}{{ tr|int }}{{ '3.5'|float }}{{ 'x'|float }}{{ 'x'|float(1.5) }}{{ 3|float }}{{ '1e3'|float }}
{{ users|groupby('city')|list }}
{% for g in users|groupby('age') %}{{ g.grouper }}:{{ g.list|map(attribute='name')|join('/') }};{% endfor %}{% for k, v in users|groupby('city', default='?') %}{{ k }}={{ v|length }};{% endfor %}
{% for city, items in users|groupby('city', case_sensitive=true, default='none') %}{{ city }}{{ items|length }};{% endfor %}
{{ l|batch(3)|list }}{{ l|batch(3, 'x')|list }}{{ l|slice(3)|list }}{{ l|slice(3, 0)|list }}{{ [1,2,3,4,5]|slice(2)|list }}
{{ l|select('odd')|list }}{{ l|reject('odd')|list }}{{ l|select('equalto', 3)|list }}{{ l|select('==', 3)|list }}{{ l|select('gt', 1)|list }}{{ [0, 1, none, '', 'a']|select|list }}{{ users|selectattr('age', 'eq', 30)|map(attribute='name')|list }}{{ users|rejectattr('city')|list|length }}{{ users|selectattr('city', 'defined')|list|length }}{{ sl|select('lower')|list }}{{ sl|select('in', ['a', 'b'])|list }}
{{ sl|map('lower')|list }}{{ sl|map('upper')|join }}{{ l|map('string')|join('-') }}{{ users|map(attribute='city')|list }}{{ users|map(attribute='city', default='?')|list }}{{ [' a ', 'b ']|map('trim')|list }}{{ ['1','2']|map('int')|sum }}{{ sl|map('replace', 'a', 'x')|list }}
{{ d|dictsort }}{{ d|dictsort(reverse=true) }}{{ d|dictsort(by='value') }}{{ {'B': 1, 'a': 2}|dictsort }}{{ {'B': 1, 'a': 2}|dictsort(true) }}{{ d|items|list }}{{ d.items()|list }}{{ d.keys()|list }}{{ d.values()|list }}{{ d.items() }}{{ d.keys() }}
{{ d.get('a') }}{{ d.get('zz') }}{{ d.get('zz', 5) }}
{{ d.items is defined }}{{ d.update is defined }}{{ d['items'] }}{{ d['get'] is defined }}{{ d.copy() }}{{ l.count(3) }}{{ l.index(2) }}
{{ sl.index('zz') }}
{{ (1, 2) }}{{ (1,) }}{{ () }}{{ [(1, 'a')] }}{{ (1, 2) == [1, 2] }}{{ (1, 2) + (3,) }}{{ [1] + [2] }}{{ 'ab' * 3 }}{{ 3 * 'ab' }}{{ [1, 2] * 2 }}{{ (1,) * 2 }}{{ 'x' * -1 }}
{{ [1, 2] + (3,) }}
{{ 1 + 2 * 3 }}{{ 7 // 2 }}{{ -7 // 2 }}{{ 7 % -3 }}{{ -7 % 3 }}{{ 7.5 // 2 }}{{ -7.5 % 2 }}{{ 2 ** 10 }}{{ 2 ** -2 }}{{ 2 ** 0.5 }}{{ 10 / 4 }}{{ 0.1 + 0.2 }}{{ 1 / 3 }}{{ 1e16 }}{{ 1.5e-5 }}{{ 100.0 }}{{ -0.0 }}{{ true + 1 }}
{{ 1 / 0 }}
{{ 'a' + 1 }}
{{ 'a' < 1 }}
{{ [1, 2] < [1, 3] }}{{ (1, 2) < (1, 2, 0) }}{{ 'b' > 'a' }}{{ 'ä' > 'z' }}{{ 1 < 2.5 }}{{ 1 == 1.0 }}{{ true == 1 }}{{ none == none }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}
{{ 'a' in 'abc' }}{{ 'x' not in 'abc' }}{{ 1 in [1, 2] }}{{ 'a' in d }}{{ 'z' in d }}{{ 1 in d }}{{ 'a' in undefinedx }}
{{ 1 in 'abc' }}
{{ 1 in 5 }}
{% for x in l %}{{ loop.cycle('odd', 'even') }}{{ loop.index }}/{{ loop.length }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.depth }}{{ loop.depth0 }}{% if loop.previtem is defined %}p{{ loop.previtem }}{% endif %}{% if loop.nextitem is defined %}n{{ loop.nextitem }}{% endif %}{{ loop.changed(x) }};{% endfor %}
{% for x in l %}{{ loop }}{% endfor %}{% set ns = namespace(a=1, b=[1]) %}{{ ns }}{% set ns.a = ns.a + 1 %}{{ ns.a }}{{ ns.b }}{{ ns.zz is defined }}
{{ raise_exception is defined }}{{ strftime_now is defined }}{{ range is defined }}{{ namespace is defined }}{{ dict is defined }}{{ raise_exception is callable }}{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %A %j %B') }}
{{ range(5)|list }}{{ range(2, 10, 3)|list }}{{ range(5, 0, -2)|list }}{{ range(0)|list }}{{ dict(a=1, b='x') }}{{ dict(d, c=3) }}
{{ range(200000)|length }}
{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}{{ 1 is number }}{{ 1.5 is number }}{{ tr is number }}{{ 1 is integer }}{{ tr is integer }}{{ 1.0 is float }}{{ tr is boolean }}{{ tr is true }}{{ false is false }}{{ d is mapping }}{{ l is mapping }}{{ l is iterable }}{{ 'a' is iterable }}{{ 5 is iterable }}{{ l is sequence }}{{ d is sequence }}{{ 5 is sequence }}{{ x is iterable }}{{ x is callable }}
{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 3 is eq 3 }}{{ 3 is equalto 3 }}{{ 3 is ne 3 }}{{ 3 is lt 4 }}{{ 3 is le 3 }}{{ 3 is gt 4 }}{{ 3 is ge 3 }}{{ 3 is greaterthan 2 }}{{ 3 is lessthan 2 }}{{ 'a' is in 'abc' }}{{ 2 is in l }}{{ 'abc' is lower }}{{ 'Abc' is lower }}{{ 'ÄB' is upper }}{{ 'upper' is filter }}{{ 'odd' is test }}{{ 'a' is escaped }}{{ 3.0 is odd }}{{ 7.5 is divisibleby 2.5 }}
{{ 'wordcount' is filter }}{{ 'nosuch' is filter }}{{ 'sameas' is test }}{{ 'xyz' is test }}{{ 'tojson' is filter }}{{ 5 is filter }}
{{ l|first }}{{ l|last }}{{ 'héllo'|first }}{{ 'héllo'|last }}{{ d|first }}{{ d|last }}{{ e|first }}{{ e|first is defined }}{{ x|first is defined }}{{ l|length }}{{ d|length }}{{ 'héllo'|length }}{{ x|length }}{{ l|count }}{{ 'hé'|list }}{{ d|list }}{{ x|list }}{{ l|reverse|list }}{{ 'héllo'|reverse }}{{ (1, 2)|list }}{{ d.keys()|list }}
{{ 5|length }}
{{ l|join }}{{ l|join(', ') }}{{ users|join(', ', attribute='name') }}{{ users|map(attribute='name')|join(' & ') }}{{ x|join }}{{ [1, none, true]|join(',') }}
{{ x|default('dflt') }}{{ ''|default('empty') }}{{ ''|default('empty', true) }}{{ none|default('n') }}{{ none|default('n', true) }}{{ x|d('d') }}{{ 0|d(5, boolean=true) }}
{{ '<a href="x">&\'</a>'|e }}{{ '<b>'|escape }}{{ 5|e }}{{ '<'|forceescape }}{{ '<'|safe }}
{{ 'a long sentence that goes on and on'|truncate(15) }}|{{ 'a long sentence that goes on'|truncate(12, true) }}|{{ 'short'|truncate(10) }}|{{ 'a long sentence that goes on and on'|truncate(15, false, '…', 0) }}
{{ 'line1\nline2\n\nline4'|indent }}|{{ 'line1\nline2\n  \nline4'|indent(2, true) }}|{{ 'a\nb'|indent('--') }}|{{ 'a\n\nb'|indent(2, blank=true) }}|{{ 'a\r\nb\x85c'|indent(1) }}|{{ ''|indent(first=true) }}
{{ {'a': 'ü', 'b': [1, 2.5, none, true, {'c': 'x"y'}]}|tojson }}|{{ {'a': [1, {'b': 2}], 'e': {}}|tojson(indent=2) }}|{{ {'a': [1]}|tojson(indent=0) }}|{{ {'a': [1]}|tojson(indent='\t') }}|{{ {'z': 1, 'ä': 2, 'a': 3}|tojson(sort_keys=true) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ 'é😀\x7f'|tojson(ensure_ascii=true) }}|{{ (1, 'a')|tojson }}|{{ 1e100|tojson }}|{{ '\x01\n\t'|tojson }}
{{ d.keys()|tojson }}
{{ x|tojson }}
{{ users[0]|attr('name') }}{{ d|attr('items') is defined }}{{ 'abc'[1] }}{{ 'abc'[-1] }}{{ 'héllo'[1:3] }}{{ 'héllo'[::-1] }}{{ l[1:] }}{{ l[::2] }}{{ l[-2:] }}{{ (1, 2, 3)[1:] }}{{ l.0 }}{{ l[10] is defined }}{{ users.0.name }}
{% with a = 1, b = 'x' %}{{ a }}{{ b }}{% endwith %}{{ a is defined }}{% filter upper %}shout {{ 'it' }}{% endfilter %}{% set blk | trim | upper %}  inner  {% endset %}[{{ blk }}]{% raw %}{{ not rendered }}{% endraw %}
{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=3, a=4) }}{{ m }}{{ m is callable }}{{ m is defined }}
{% macro m(a, b='B') %}{% endmacro %}{{ m(1, 2, 3) }}
{{ 'abc'|format }}{{ '%d items'|format(3) }}{{ '{0}'.format([1, 2]) }}{{ '{:d}'.format(true) }}{{ '{}'.format(true) }}{{ '{}|{!s:>5}'.format(none, none) }}
{{ '{:>5}'.format(none) }}
{{ '{:s}'.format(5) }}
{% for a, b in [(1, 'x'), (2, 'y')] %}{{ a }}{{ b }}{% endfor %}{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% set p, q = 'ab' %}{{ p }}{{ q }}{% set r, t2 = 1, 2 %}{{ r + t2 }}
{% for a, b in [1, 2] %}{% endfor %}
{% set x1 = 1 %}{% for i in l %}{{ x1 }}{% set x1 = x1 + 1 %}{{ x1 }},{% endfor %}{{ x1 }}{% if true %}{% set x1 = 5 %}{% endif %}{{ x1 }}
{% for i in e %}never{% else %}empty{% endfor %}{% for i in l if i > 1 %}{{ loop.index }}:{{ i }}{% if loop.last %}.{% endif %}{% endfor %}{% for i in l %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}{% for i in l %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}
{% for i in [1, 2] %}{% for j in 'ab' %}{{ loop.index }}{{ j }}{% endfor %}{{ loop.index }}{% endfor %}{% for i in [1, 2, 3] %}{% set outer = loop %}{% for j in [1] %}{{ outer.index }}{% endfor %}{% endfor %}
{% generation %}{% set g1 = 1 %}gen{{ g1 }}{% endgeneration %}{{ g1 is defined }}{% with %}{% set w1 = 2 %}{% endwith %}{{ w1 is defined }}{% filter lower %}ÄB{% set f1 = 3 %}{% endfilter %}{{ f1 is defined }}
{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}{% macro kw(a, b=2, c=3) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ kw(1, c=9) }}{% macro early() %}{{ later() }}{% endmacro %}{% macro later() %}L{% endmacro %}{{ early() }}
{% macro kw(a, b=2, c=3) %}{% endmacro %}{{ kw(1, z=2) }}
{% macro m() %}{{ x }}{% endmacro %}{% set x = 5 %}{{ m() }}
{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}
{% for i in [1,2] %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}{% endfor %}
{% set x = 1 %}{% for i in [1] %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 3 %}{{ m() }}{% endfor %}
{% macro outer() %}{% set y = 4 %}{% macro inner() %}{{ y }}{% endmacro %}{{ inner() }}{% endmacro %}{{ outer() }}
{% set ns = namespace(v=[]) %}{% for i in range(3) %}{% set ns.v = ns.v + [i] %}{% endfor %}{{ ns.v }}
{% for m in users %}{% set c = m.content %}{% if loop.first %}{% set first = c %}{% endif %}{% endfor %}{{ first is defined }}{{ c is defined }}
{% if true %}{% set z = 1 %}{% endif %}{{ z }}
{% set a = [1] %}{% set b = a %}{{ b }}{% for x in a %}{{ loop.index }}{% endfor %}
{{ -1|abs }}{{ 2 ** 3 ** 2 }}{{ -2 ** 2 }}{{ not 1 in [1] }}{{ 1 is not none }}{{ "a" "b" }}{{ {'a': 1,}['a'] }}{{ [1,][0] }}{{ 'x' ~ 1 + 2 }}{{ 'ab' * 2 ~ 'c' }}{{ 1 + 2 | string }}
{{ x | default('d') | upper }}{{ (x or 'y') | upper }}{{ 'a' if true else 'b' if true else 'c' }}{{ ('a' if false) ~ 'z' }}{{ 1 < 2 == true }}{{ 1 == 1 == 1 }}{{ 'b' in 'abc' == true }}
{% macro m(a, b=a ~ '!') %}{{ b }}{% endmacro %}{{ m('hi') }}{% macro n2(a=[]) %}{{ a|length }}{% endmacro %}{{ n2() }}{{ n2([1]) }}
{{ '\'' ~ "\"" ~ '\\' ~ '\x41\u00e9\U0001F600\101\n' ~ 'tab\tx' }}
{{ l | join(',') }}{{ l|join }}{{l|length}}{{l |first}}
{% set t = (1, 2) %}{{ t[0] }}{{ t|length }}{{ t is iterable }}{{ t is sequence }}{{ t|list }}{{ t|tojson }}{% for a in t %}{{ a }}{% endfor %}
{{ {'b': 1, 'a': 2} }}{{ {'k': none, 'f': 1.5, 't': true, 's': "it's", 'q': 'say "x"', 'both': 'it\'s "x"'} }}{{ ['a\nb', 'é', '\x00x'|replace('\x00', '')] }}
{{ 0.1 }}{{ 1e-7 }}{{ 123456789012345678.0 }}{{ 1.0e15 }}{{ 1.5e16 }}{{ 3.0 }}{{ 2.5e-5 }}{{ 0.000123 }}{{ 100 / 3 }}{{ 10 / 2 }}{{ 7 // 2.0 }}{{ 2 ** 0 }}{{ 0 ** 0 }}{{ 1 - 1.0 }}
{{ l[1:3] }}{{ l[:-1] }}{{ l[::-1] }}{{ l[5:] }}{{ l[-100:2] }}{{ 'abc'[5:] }}{{ l[1:2:0] }}
{{ l[1:x] }}{{ l[none:2] }}
{% for x in l %}{{ loop.index0 }}{% if not loop.last %},{% endif %}{% endfor %}{% for x in [] %}{% else %}none{% endfor %}{% for x in none %}{% else %}nothing{% endfor %}
{% for k in d %}{{ k }}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}{% for a, b in d|dictsort %}{{ a }}{{ b }}{% endfor %}
{% for x in 5 %}{% endfor %}
{{ d['a'] }}{{ d.a }}{{ d['zz'] }}{{ d.zz is defined }}{{ d['zz'] is undefined }}{{ l[0] }}{{ l['x'] is defined }}{{ none.x is defined }}{{ 5.x is defined }}{{ 'abc'.x is defined }}
{{ x.y }}
{{ none.x.y }}
{% set a = 1 %}{% set a = a + 1 %}{{ a }}{% set b, c = [1, 2] %}{{ b + c }}{% set ns = namespace() %}{% set ns.k = 'v' %}{{ ns.k }}{% set ns2 = namespace(ns) %}{{ ns2.k }}
{% set q.x = 1 %}
{{ "%s"|format(none) }}{{ "%5s|%-5s|" % ("ab", "cd") }}{{ "%.2f" % 1 }}{{ "%d%%" % 50 }}{{ '%i' % 3.99 }}{{ '%+.1e' % -12345.678 }}{{ '%G' % 1e-10 }}{{ '%#.3g' % 1 }}{{ '% d' % 5 }}{{ '%5.3d' % 7 }}{{ '%-08.2f|' % 3.14159 }}{{ '%010.3f' % -3.14159 }}
{{ '%*d|%-*s|%.*f' % (5, 42, 4, 'x', 2, 3.14159) }}{{ '%c%c' % ('ü', 0x1F600) }}{{ '%r' % "it's" }}{{ '%s' % 'é' }}{{ '%5s|' % 'é' }}{{ '%.1s' % 'éa' }}
{{ '{:>10}'.format('é') }}{{ '{:^5}'.format('日') }}{{ '{:,.2f}'.format(1234567.891) }}{{ '{:_d}'.format(1000000) }}{{ '{:=+8.2f}'.format(-1.5) }}{{ '{:#x}|{:#o}|{:#b}'.format(255, 8, 5) }}{{ '{:c}'.format(233) }}{{ '{:e}'.format(0.0) }}{{ '{:.0f}'.format(2.5) }}{{ '{:.0f}'.format(3.5) }}{{ '{:g}'.format(1e20) }}{{ '{:G}'.format(1.5e-10) }}{{ '{:%}'.format(1) }}{{ '{:.2%}'.format(0.12345) }}
{{ '{:n}'.format(1234) }}{{ '{:5d}|{:<5d}|{:^5d}|{:05}'.format(1, 2, 3, -4) }}{{ '{:.3s}'.format('abcdef') }}{{ '{0!s:>4}'.format(1) }}{{ '{:}'.format(3) }}
{{ 'a' if 1 > 2 }}|{{ 'yes' if l else 'no' }}|{{ none or 'or' }}|{{ 0 and 'and' }}|{{ [] or {} or 'last' }}|{{ not none }}|{{ -(3) }}|{{ +3 }}|{{ 'ab' ~ 1.0 ~ none ~ [1] ~ (2,) }}
{{ users[0].nothing }}{{ users[0]['nothing'] is defined }}{{ users[5] is defined }}{{ users[0].name.upper() }}{{ users[-1]['name'][0] }}
{{ users[5].name }}
{{ nothing.attr }}
{{ 'abc'.nosuch }}{{ 'abc'.upper is defined }}{{ l.append is defined }}{{ l.count is defined }}
{{ raise_exception('Custom message: ' ~ n) }}
{{ range(3)|map('string')|join('+') }}{{ range(3)|sum }}{{ (range(3)|list)[1:] }}{{ [3, 2, 1]|sort|first }}{{ 'hello world'.split()|map('capitalize')|join(' ') }}{{ sl|map('lower')|unique|list|length }}
{{ s[0] }}{{ s[:6] }}{{ s[-4:] }}{{ s|length }}{{ s.split()|length }}{{ s.split()[1]|lower }}{{ s|replace('ß', 'ss') }}{{ s.count('Σ') }}{{ s.find('Ü') }}{{ s.index('ΟΔΟΣ') }}
{{ 'x=%-6s|%6.2f|%+d' % ('ab', 3.14159, 5) }}{{ '%s' % (('a', 'b'),) }}{{ '%%|%5s|%-5s|' % ('é', 'ü') }}{{ '%(name)s is %(age)d' % users[0] }}
{{ '%d' % 'x' }}
{{ '%s %s' % ('a',) }}
{{ '{:>8.3f}|{:<+8d}|{:^10s}|{:_}|{:.1%}|{:08.2f}|{:x>5}'.format(3.14159, 42, 'mid', 1234567, 0.256, -3.5, 'é') }}
{{ '{0} {0}'.format('rep') }}{{ '{a[0]}{b.c}'.format(a=[9], b={'c': 8}) }}{{ '{!r}'.format('q') }}{{ '{:5}|'.format(12) }}{{ '{:5}|'.format('ab') }}{{ '{}'.format(1.5) }}{{ '{:.3}'.format(1.0) }}
{{ '{} {}'.format(1) }}
{{ '{0} {}'.format(1, 2) }}
{{ l|tojson }}{{ d|tojson(indent=1) }}{{ users|tojson }}{{ none|tojson }}{{ tr|tojson }}{{ 1.0|tojson }}{{ 'ü'|tojson }}{{ s|tojson(ensure_ascii=true) }}{{ {'a': (1, 2)}|tojson }}{{ [[]]|tojson(indent=2) }}{{ {}|tojson(indent=2) }}
{{ users|map(attribute='age')|select('gt', 26)|list }}{{ users|selectattr('name', 'lower')|map(attribute='name')|list }}{{ users|rejectattr('age', 'divisibleby', 10)|list|length }}{{ users|selectattr('city', 'equalto', 'oslo')|first }}
{{ l|select('in', [1, 2])|list }}{{ sl|reject('equalto', 'a')|list }}{{ users|map(attribute='name')|map('upper')|list }}{{ users|map(attribute='name')|map('length')|list }}{{ users|map('tojson')|join }}
""".split("\n") if t]

BUILTIN_VARS = [
    {"s": "Straße ÄÖÜ ΟΔΟΣ İstanbul ǆemal ﬁnal", "w": "  hello world  ", "n": 7, "neg": -7, "f": 2.675,
     "l": [3, 1, 2, 3], "sl": ["b", "A", "a", "C"], "d": {"b": 2, "a": 1, "items": 9}, "e": [],
     "users": [{"name": "Zoë", "age": 30, "city": "Oslo"}, {"name": "adam", "age": 25, "city": "oslo"}, {"name": "Émile", "age": 30}],
     "t": "a,b,,c", "none": None, "tr": True},
    {"s": "ΣΊΣΥΦΟΣ σοφός, ŉ ǰ ﬀ", "w": "\u3000\tx y\u00a0", "n": 0, "neg": -1, "f": 0.5,
     "l": [5, -2.5, 5, 0], "sl": ["ä", "Z", "z", "é"], "d": {"k": [1, {"x": "y"}], "get": "shadowed"}, "e": [None],
     "users": [{"name": "b", "age": 1, "city": "Ä"}, {"name": "a", "age": 1, "city": "ä"}],
     "t": ",", "none": None, "tr": False},
]

# (template, text the C renderer's error must contain): where Python's integers grow past 64
# bits, sparkmono stops with an error naming the operation (Jinja2 renders a big number).
OVERFLOWS = [
    ("{{ big + 1 }}", "integer overflow in '+'"),
    ("{{ big * 2 }}", "integer overflow in '*'"),
    ("{{ -big - 2 }}", "integer overflow in '-'"),
    ("{{ 2 ** 63 }}", "integer overflow in '**'"),
    ("{{ 3 ** 40 }}", "integer overflow in '**'"),
    ("{{ (-big - 1) // -1 }}", "integer overflow in '//'"),
    ("{{ -(-big - 1) }}", "integer overflow in unary '-'"),
    ("{{ (-big - 1)|abs }}", "integer overflow in abs"),
    ("{{ [big, 1]|sum }}", "integer overflow in '+'"),
    ("{{ '99999999999999999999'|int }}", "int: '99999999999999999999' does not fit in 64 bits"),
    ("{{ 1e19|int }}", "does not fit in 64 bits"),
    ("{{ '%d' % 1e19 }}", "does not fit in 64 bits"),
    ("{{ big|round(-1) }}", "integer overflow in round"),
]

# (template, text the one-line error must contain)
REFUSED = [
    ("{% include 'other.jinja' %}", "line 1 col 4: unsupported tag 'include'"),
    ("hello\n{{ x | wordcount }}", "line 2 col 8: unsupported filter 'wordcount'"),
    ("{% if x is sameas y %}{% endif %}", "line 1 col 12: unsupported test 'sameas'"),
    ("{{ messages.append(1) }}", "unsupported method 'append()'"),
    ("{{ lipsum(3) }}", "line 1 col 4: unsupported function 'lipsum()'"),
    ("{% for x in y %}\n{{ x }}", "'endfor' is missing"),
    ("{{ 1 + }}", "line 1 col 8: expected an expression"),
    ("a\n  {% if %}", "line 2 col 9: expected an expression"),
    ("{{ 'unterminated }}", "line 1 col 4: unterminated string literal"),
    ("{% endif %}", "line 1 col 4: unexpected 'endif'"),
    ("x {{ y", "'{{' is never closed"),
    ("{% for i in x recursive %}{% endfor %}", "unsupported 'recursive' loop"),
    ("{{ " + "(" * 1000 + "1" + ")" * 1000 + " }}", "line 1 col 204: nested more than 200 deep"),
    ("{{ " + "-" * 100000 + "1 }}", "nested more than 200 deep"),
    ("{% if 1 %}" * 300 + "{% endif %}" * 300, "nested more than 200 deep"),
    ("{{ x | wordwrap(5) }}", "line 1 col 8: unsupported filter 'wordwrap'"),
    ("{{ x | map('nosuch') | list }}", "line 1 col 12: unsupported filter 'nosuch' (in map)"),
    ("{{ x | selectattr('a', 'prime') | list }}", "line 1 col 24: unsupported test 'prime' (in selectattr)"),
    ("{{ x | reject('sameas', 1) | list }}", "unsupported test 'sameas' (in reject)"),
    ("{% call m() %}x{% endcall %}", "line 1 col 4: unsupported tag 'call'"),
    ("{% extends 'base.html' %}", "unsupported tag 'extends'"),
    ("{% do x.append(1) %}", "unsupported tag 'do'"),
    ("{{ joiner(', ')() }}", "unsupported call of an expression"),
    ("{% set j = cycler('a', 'b') %}", "unsupported function 'cycler()'"),
    ("{{ x.update({'a': 1}) }}", "unsupported method 'update()'"),
    ("{{ '%s' % x.encode() }}", "unsupported method 'encode()'"),
    ("{% raw %}never closed", "'{% raw %}' is never closed"),
    ("{{ 99999999999999999999 }}", "integer literal beyond 64 bits"),
    ("{{ later() }}", "unsupported function 'later()' (not a macro of the template)"),
]
