//! `GET /v1/models` and `GET /v1/models/{model}`: the one served model.

use actix_web::web::{Data, Path};
use actix_web::{HttpResponse, get};

use super::errors::ApiError;
use super::state::{AppState, Ready};
use super::types::{ErrorResponse, ModelCard, ModelList, ModelPermission};

/// List the served models.
#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "openai",
    responses(
        (status = 200, description = "The served model", body = ModelList),
        (status = 401, description = "Missing or wrong API key", body = ErrorResponse),
        (status = 503, description = "Not ready", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[get("/v1/models")]
pub async fn list_models(state: Data<AppState>) -> Result<HttpResponse, ApiError> {
    let ready = state.ready()?;
    Ok(HttpResponse::Ok().json(ModelList {
        object: "list".into(),
        data: vec![card(&state, ready)],
    }))
}

/// Retrieve a model: the served one, by its served name or its own; 404 for any other.
#[utoipa::path(
    get,
    path = "/v1/models/{model}",
    tag = "openai",
    params(("model" = String, Path, description = "The model's id, as `GET /v1/models` lists it")),
    responses(
        (status = 200, description = "The model", body = ModelCard),
        (status = 401, description = "Missing or wrong API key", body = ErrorResponse),
        (status = 404, description = "No such model", body = ErrorResponse),
        (status = 503, description = "Not ready", body = ErrorResponse),
    ),
    security(("bearer" = []))
)]
#[get("/v1/models/{model:.*}")]
pub async fn retrieve_model(
    state: Data<AppState>,
    model: Path<String>,
) -> Result<HttpResponse, ApiError> {
    let ready = state.ready()?;
    ready.check_model(Some(&model))?;
    Ok(HttpResponse::Ok().json(card(&state, ready)))
}

/// vLLM's `root` without the directories the model lies in (a card is public, the server's
/// file layout is not): a file's or directory's name, an `hf:` id as given.
fn root(path: &str) -> String {
    if path.starts_with("hf:") {
        return path.to_string();
    }
    std::path::Path::new(path)
        .file_name()
        .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned())
}

/// The served model's card.
fn card(state: &AppState, ready: &Ready) -> ModelCard {
    ModelCard {
        id: ready.model_name.clone(),
        object: "model".into(),
        created: ready.created,
        owned_by: "kiln".into(),
        root: root(&state.config.model.path),
        parent: None,
        max_model_len: ready.client.max_model_len(),
        permission: vec![ModelPermission {
            id: format!("modelperm-{}", ready.model_name),
            object: "model_permission".into(),
            created: ready.created,
            allow_create_engine: false,
            allow_sampling: true,
            allow_logprobs: true,
            allow_search_indices: false,
            allow_view: true,
            allow_fine_tuning: false,
            organization: "*".into(),
            group: None,
            is_blocking: false,
        }],
    }
}
