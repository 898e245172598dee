//! Chat templates: the model's Jinja `chat_template` (or a plain default) rendered with minijinja.

use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

use super::Tokenizer;

/// Used when a model ships no template: plain `Role: text` turns, BOS first, EOS after each
/// assistant turn, and `Assistant:` as the generation prompt. With `tools` it lists them and
/// asks for Hermes-style `<tool_call>{"name": ..., "arguments": ...}</tool_call>` calls,
/// renders an assistant's calls the same way and tool results as `Tool (id): text` turns.
pub const DEFAULT_CHAT_TEMPLATE: &str = "{{ bos_token }}\
{% if tools %}You can call these functions. To call one, answer with \
<tool_call>{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}</tool_call>.\n\
{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{{ '\n' }}{% endif %}\
{% for message in messages %}\
{% if message['role'] == 'system' %}{{ message['content'] }}\n\n\
{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n\
{% elif message['role'] == 'assistant' %}Assistant: {{ message['content'] }}\
{% if message.tool_calls %}{% for call in message.tool_calls %}\
<tool_call>{\"name\": {{ call.function.name | tojson }}, \"arguments\": {{ call.function.arguments | tojson }}}</tool_call>\
{% endfor %}{% endif %}{{ eos_token }}\n\
{% elif message['role'] == 'tool' %}Tool ({{ message.tool_call_id }}): {{ message['content'] }}\n\
{% else %}{{ raise_exception('unsupported role: ' ~ message['role']) }}\
{% endif %}\
{% endfor %}\
{% if add_generation_prompt %}Assistant:{% endif %}";

/// Name under which the template is stored in its environment.
const NAME: &str = "chat";

/// Instructions one render may run (minijinja's fuel; well under a second of one core). The
/// shipped templates render `limits.max_messages` (1,024) messages with tools well within it;
/// nested loops over long ranges run out of it.
pub const RENDER_FUEL: u64 = 20_000_000;

/// How deep one render may nest (minijinja's recursion limit: a loop or `if` counts 1, a
/// macro call about 10), well inside a 2 MiB blocking thread's stack; a macro or a
/// `recursive` loop calling itself without end reaches it.
pub const RENDER_RECURSION: usize = 200;

/// Bytes one render may write: a prompt past this cannot fit any context Kiln serves
/// (request bodies stop at `server.max_body_bytes`), so a template that writes more (a
/// string doubled in a loop) stops here instead of filling memory. A string doubled in a
/// variable and never written is not caught: minijinja has no hook on `~` (its `*` stops at
/// 100 MB).
pub const RENDER_MAX_BYTES: usize = 64 << 20;

/// Errors from compiling or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The template source does not compile.
    #[error("invalid chat template: {0}")]
    Syntax(String),
    /// The template refused the conversation (`raise_exception`) or failed while rendering.
    #[error("chat template: {0}")]
    Render(String),
    /// The render ran past one of its limits ([`RENDER_FUEL`], [`RENDER_RECURSION`],
    /// [`RENDER_MAX_BYTES`]); the message names it.
    #[error("chat template: {0}")]
    Limit(String),
}

/// One chat turn, its content already flattened to text.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's tool calls (the template sees them only when there are some).
    pub tool_calls: Vec<TemplateToolCall>,
    /// A `tool` turn's answer to this call id.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// An assistant turn's reasoning (the template sees `thinking` only when set: gpt-oss's
    /// renders it before a call).
    pub thinking: Option<String>,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            thinking: None,
        }
    }
}

/// A tool call as templates see it: `{"id", "type": "function", "function": {"name",
/// "arguments"}}` with the arguments as a JSON value (a JSON text that does not parse stays a
/// string), as Hugging Face templates expect.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateToolCall {
    pub id: String,
    pub name: String,
    pub arguments: serde_json::Value,
}

/// A function offered to the model: `{"type": "function", "function": {"name",
/// "description", "parameters"}}` in the template's `tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateTool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: serde_json::Value,
}

/// A compiled chat template with the tokenizer's BOS and EOS texts. `Send + Sync`; render it
/// on a blocking pool, it is CPU work proportional to the conversation.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    is_default: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("is_default", &self.is_default)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source` with Hugging Face's Jinja settings (`trim_blocks`, `lstrip_blocks`),
    /// Python string/dict methods, `raise_exception` and `strftime_now`.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatTemplateError::Syntax(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_recursion_limit(RENDER_RECURSION);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            is_default: false,
        })
    }

    /// The tokenizer's own template, or [`DEFAULT_CHAT_TEMPLATE`] when it has none. A model
    /// template that does not compile is an error (the caller decides whether to fall back).
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Result<Self, ChatTemplateError> {
        let piece = |id: Option<u32>| {
            id.and_then(|id| tokenizer.id_to_piece(id))
                .unwrap_or_default()
        };
        let bos = piece(tokenizer.bos_id());
        let eos = piece(tokenizer.eos_ids().first().copied());
        match tokenizer.chat_template() {
            Some(source) => Self::new(source, &bos, &eos),
            None => Self::default_for(&bos, &eos),
        }
    }

    /// The tokenizer's `tool_use` template (from a `chat_template` list), if it has one: the
    /// one to render requests with tools, as Hugging Face's `apply_chat_template` does.
    pub fn tool_use_for_tokenizer(
        tokenizer: &Tokenizer,
    ) -> Option<Result<Self, ChatTemplateError>> {
        let piece = |id: Option<u32>| {
            id.and_then(|id| tokenizer.id_to_piece(id))
                .unwrap_or_default()
        };
        let bos = piece(tokenizer.bos_id());
        let eos = piece(tokenizer.eos_ids().first().copied());
        tokenizer
            .tool_use_template()
            .map(|source| Self::new(source, &bos, &eos))
    }

    /// [`DEFAULT_CHAT_TEMPLATE`] with the given BOS and EOS texts.
    pub fn default_for(bos_token: &str, eos_token: &str) -> Result<Self, ChatTemplateError> {
        let mut t = Self::new(DEFAULT_CHAT_TEMPLATE, bos_token, eos_token)?;
        t.is_default = true;
        Ok(t)
    }

    /// Whether this is the built-in default rather than the model's template.
    pub fn is_default(&self) -> bool {
        self.is_default
    }

    /// The template's Jinja source (tool-call formats are recognised by the markers in it).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends where the
    /// assistant's reply begins. Encode it without adding BOS: templates write `bos_token`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with_tools(messages, &[], add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with `tools` offered to the model (`tools` is none in the
    /// template when the list is empty).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[TemplateTool],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_thinking(messages, tools, add_generation_prompt, None)
    }

    /// [`ChatTemplate::render_with_tools`] with `enable_thinking` set for the template when
    /// given (Qwen3's templates read it: `false` writes an empty thinking block, so the reply
    /// answers at once); left undefined otherwise, as Hugging Face leaves it.
    pub fn render_thinking(
        &self,
        messages: &[ChatMessage],
        tools: &[TemplateTool],
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String, ChatTemplateError> {
        let extra = enable_thinking.map(|on| ("enable_thinking", Value::from(on)));
        self.render_vars(messages, tools, add_generation_prompt, extra)
    }

    /// [`ChatTemplate::render_with_tools`] with `reasoning_effort` set for the template
    /// (gpt-oss style templates read it: `low`, `medium`, `high`).
    pub fn render_effort(
        &self,
        messages: &[ChatMessage],
        tools: &[TemplateTool],
        add_generation_prompt: bool,
        reasoning_effort: &str,
    ) -> Result<String, ChatTemplateError> {
        let extra = Some(("reasoning_effort", Value::from(reasoning_effort)));
        self.render_vars(messages, tools, add_generation_prompt, extra)
    }

    /// Renders with the standard variables and `extra`, if any.
    fn render_vars(
        &self,
        messages: &[ChatMessage],
        tools: &[TemplateTool],
        add_generation_prompt: bool,
        extra: Option<(&'static str, Value)>,
    ) -> Result<String, ChatTemplateError> {
        let messages: Vec<Value> = messages.iter().map(message_value).collect();
        let tools = if tools.is_empty() {
            Value::from(())
        } else {
            Value::from(tools.iter().map(tool_value).collect::<Vec<_>>())
        };
        let mut pairs = vec![
            ("messages", Value::from(messages)),
            ("tools", tools),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
        ];
        pairs.extend(extra);
        let ctx = Value::from_pairs(pairs);
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        let mut out = CappedOutput::default();
        match template.render_captured_to(ctx, &mut out) {
            Ok(_) => String::from_utf8(out.bytes)
                .map_err(|_| ChatTemplateError::Render("output is not UTF-8".into())),
            Err(_) if out.over => Err(ChatTemplateError::Limit(format!(
                "the rendered prompt passed the template output limit of {RENDER_MAX_BYTES} bytes"
            ))),
            Err(e) => Err(classify(&e)),
        }
    }
}

/// A render's output, refusing any write that would take it past [`RENDER_MAX_BYTES`].
#[derive(Default)]
struct CappedOutput {
    bytes: Vec<u8>,
    /// Set when a write was refused (the render's error is then this limit).
    over: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > RENDER_MAX_BYTES {
            self.over = true;
            return Err(std::io::Error::other("chat template output limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A render error: the fuel and recursion limits by name, anything else as the template's.
fn classify(e: &Error) -> ChatTemplateError {
    if e.kind() == ErrorKind::OutOfFuel {
        return ChatTemplateError::Limit(format!(
            "the template ran past its instruction limit ({RENDER_FUEL} steps)"
        ));
    }
    if e.kind() == ErrorKind::InvalidOperation && e.detail() == Some("recursion limit exceeded") {
        return ChatTemplateError::Limit(format!(
            "the template nested past its recursion limit ({RENDER_RECURSION})"
        ));
    }
    ChatTemplateError::Render(describe(e))
}

/// A map that keeps its keys in insertion order (minijinja's own maps sort them), so that
/// templates iterate and `tojson` messages and tools in the order Python would.
#[derive(Debug)]
struct OrderedMap(Vec<(String, Value)>);

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let key = key.as_str()?;
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(
            self.0
                .iter()
                .map(|(k, _)| Value::from(k.as_str()))
                .collect(),
        )
    }
}

fn ordered(pairs: Vec<(&str, Value)>) -> Value {
    Value::from_object(OrderedMap(
        pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    ))
}

/// A message as HF templates expect it: `tool_calls`, `tool_call_id`, `name` and `thinking`
/// only when set
/// (templates test `'tool_calls' in message`).
fn message_value(m: &ChatMessage) -> Value {
    let mut pairs = vec![
        ("role", Value::from(m.role.as_str())),
        ("content", Value::from(m.content.as_str())),
    ];
    if !m.tool_calls.is_empty() {
        let calls = m.tool_calls.iter().map(|c| {
            let function = ordered(vec![
                ("name", Value::from(c.name.as_str())),
                ("arguments", json_value(&c.arguments)),
            ]);
            ordered(vec![
                ("id", Value::from(c.id.as_str())),
                ("type", Value::from("function")),
                ("function", function),
            ])
        });
        pairs.push(("tool_calls", Value::from(calls.collect::<Vec<_>>())));
    }
    if let Some(id) = &m.tool_call_id {
        pairs.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(name) = &m.name {
        pairs.push(("name", Value::from(name.as_str())));
    }
    if let Some(thinking) = &m.thinking {
        pairs.push(("thinking", Value::from(thinking.as_str())));
    }
    ordered(pairs)
}

fn tool_value(t: &TemplateTool) -> Value {
    let mut function = vec![("name", Value::from(t.name.as_str()))];
    if let Some(d) = &t.description {
        function.push(("description", Value::from(d.as_str())));
    }
    function.push(("parameters", json_value(&t.parameters)));
    ordered(vec![
        ("type", Value::from("function")),
        ("function", ordered(function)),
    ])
}

/// A JSON value as a template value (objects as [`OrderedMap`]s).
fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(0.0)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(items) => Value::from(items.iter().map(json_value).collect::<Vec<_>>()),
        J::Object(map) => Value::from_object(OrderedMap(
            map.iter()
                .map(|(k, v)| (k.clone(), json_value(v)))
                .collect(),
        )),
    }
}

/// `tojson`, as Hugging Face defines it for chat templates: Python's `json.dumps` with
/// `ensure_ascii=False` (`", "` and `": "` separators; with `indent`, newlines and `","`),
/// keys in the map's own order, nothing HTML-escaped.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // Accepted for compatibility; the output is always `ensure_ascii=False` and unsorted.
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, indent, 0)?;
    Ok(Value::from(out))
}

fn write_json(
    out: &mut String,
    v: &Value,
    indent: Option<usize>,
    depth: usize,
) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => match v.as_i64() {
            Some(i) if v.is_integer() => out.push_str(&i.to_string()),
            _ => {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                let n = serde_json::Number::from_f64(f);
                out.push_str(&n.map_or_else(|| "NaN".into(), |n| n.to_string()));
            }
        },
        ValueKind::String => {
            out.push_str(&serde_json::to_string(v.as_str().unwrap_or_default()).unwrap_or_default())
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                write_json(out, item, indent, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                let name = key.as_str().map_or_else(|| key.to_string(), str::to_string);
                out.push_str(&serde_json::to_string(&name).unwrap_or_default());
                out.push_str(": ");
                write_json(out, &v.get_item(key)?, indent, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => out.push_str(&serde_json::to_string(&v.to_string()).unwrap_or_default()),
    }
    Ok(())
}

/// `raise_exception(msg)`: the template rejects the conversation with `msg`.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(fmt)`: today's date; only the formats chat templates use are understood
/// (`%d`, `%m`, `%Y`, `%b`, `%B`), in UTC.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    format
        .replace("%d", &format!("{d:02}"))
        .replace("%m", &format!("{m:02}"))
        .replace("%Y", &y.to_string())
        .replace("%B", month)
        .replace("%b", &month[..3])
}

/// Year, month (1..=12) and day of a count of days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The error's message with its cause (minijinja keeps the `raise_exception` text in `detail`).
fn describe(e: &Error) -> String {
    match e.detail() {
        Some(detail) if e.kind() == ErrorKind::InvalidOperation => detail.to_string(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests;
