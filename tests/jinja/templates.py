"""templates.py: the chat templates tests/jinja/jinjacmp.py renders with Jinja2 and with
sparkmono's C renderer (written for these tests in the style of the Llama-3, ChatML and
Mistral templates and of the tool-calling ChatML ones, plus templates that exercise every
supported construct), and the templates the C renderer must refuse (the construct named,
its line and column)."""

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

TEMPLATES = {"undefined": UNDEFINED, "chatml": CHATML, "llama3": LLAMA3, "mistral": MISTRAL, "kitchen": KITCHEN, "whitespace": WHITESPACE}
TOOL_TEMPLATES = {"tools": TOOLS}

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
]
