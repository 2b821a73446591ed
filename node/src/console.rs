//! The web console (issue 19): plain HTML, CSS and JavaScript modules from `node/console/`,
//! compiled into the binary (no bundler, nothing fetched at run time). `GET /` is the page,
//! `GET /console/{file}` one of a fixed list of assets; `/ui` and `/dashboard` redirect to `/`.
//! The page calls the API under `/v1` with the key the user signs in with (kept per tab), so
//! these routes need no key themselves. Every answer forbids caching without revalidation
//! and carries a content security policy that allows only this origin.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use crate::api::ApiError;

/// Scripts, styles, images and API calls from this origin only; no inline script or style,
/// no frames, no plugins.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
    object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// One file of the console: its name under `/console/`, media type and bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file the console is made of, `index.html` first (also served at `/`).
const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../console/index.html"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../console/style.css"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../console/favicon.svg"),
    },
    Asset {
        name: "app.js",
        content_type: JS,
        body: include_bytes!("../console/app.js"),
    },
    Asset {
        name: "api.js",
        content_type: JS,
        body: include_bytes!("../console/api.js"),
    },
    Asset {
        name: "sse.js",
        content_type: JS,
        body: include_bytes!("../console/sse.js"),
    },
    Asset {
        name: "dom.js",
        content_type: JS,
        body: include_bytes!("../console/dom.js"),
    },
    Asset {
        name: "i18n.js",
        content_type: JS,
        body: include_bytes!("../console/i18n.js"),
    },
    Asset {
        name: "kbs.js",
        content_type: JS,
        body: include_bytes!("../console/kbs.js"),
    },
    Asset {
        name: "documents.js",
        content_type: JS,
        body: include_bytes!("../console/documents.js"),
    },
    Asset {
        name: "search.js",
        content_type: JS,
        body: include_bytes!("../console/search.js"),
    },
    Asset {
        name: "graph.js",
        content_type: JS,
        body: include_bytes!("../console/graph.js"),
    },
    Asset {
        name: "chat.js",
        content_type: JS,
        body: include_bytes!("../console/chat.js"),
    },
    Asset {
        name: "cluster.js",
        content_type: JS,
        body: include_bytes!("../console/cluster.js"),
    },
];

/// The console's routes, merged into the public router outside the key check.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/console/{file}", get(asset))
        .route("/ui", get(to_console))
        .route("/dashboard", get(to_console))
}

async fn index() -> Response {
    serve(&ASSETS[0])
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|asset| asset.name == file) {
        Some(asset) => serve(asset),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "asset_not_found",
            format!("the console has no file {file:?}"),
        )
        .into_response(),
    }
}

async fn to_console() -> Redirect {
    Redirect::to("/")
}

fn serve(asset: &Asset) -> Response {
    let mut response = (StatusCode::OK, asset.body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    // Revalidate every time: a rebuilt node serves its own console, never a cached older one.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves the console's routes on a loopback port; returns its base URL.
    async fn serve_console() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, routes::<()>()).await });
        format!("http://{address}")
    }

    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn the_page_and_every_asset_answer_with_their_type_and_policy() {
        let base = serve_console().await;
        let client = client();
        let mut paths = vec![("/".to_string(), ASSETS[0].content_type)];
        paths.extend(
            ASSETS
                .iter()
                .map(|asset| (format!("/console/{}", asset.name), asset.content_type)),
        );
        for (path, content_type) in paths {
            let response = client.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(response.status(), 200, "{path}");
            let headers = response.headers();
            assert_eq!(headers[header::CONTENT_TYPE], content_type, "{path}");
            assert_eq!(headers[header::CACHE_CONTROL], "no-cache", "{path}");
            assert_eq!(
                headers[header::CONTENT_SECURITY_POLICY],
                CONTENT_SECURITY_POLICY,
                "{path}"
            );
            assert!(!response.bytes().await.unwrap().is_empty(), "{path}");
        }
    }

    #[tokio::test]
    async fn an_unknown_asset_is_the_apis_json_404() {
        let base = serve_console().await;
        let response = client()
            .get(format!("{base}/console/secret.js"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "asset_not_found");
        assert_eq!(body["error"]["type"], "not_found_error");
        assert!(body["error"]["message"].is_string());
    }

    #[tokio::test]
    async fn ui_and_dashboard_redirect_to_the_console() {
        let base = serve_console().await;
        for path in ["/ui", "/dashboard"] {
            let response = client().get(format!("{base}{path}")).send().await.unwrap();
            assert!(response.status().is_redirection(), "{path}");
            assert_eq!(response.headers()[header::LOCATION], "/", "{path}");
        }
    }

    #[test]
    fn the_console_stays_small() {
        // What it adds to the binary (about 115 KiB); a bundled framework would show here.
        let bytes: usize = ASSETS.iter().map(|asset| asset.body.len()).sum();
        assert!(bytes < 256 * 1024, "the console is {bytes} bytes");
    }

    #[test]
    fn every_module_the_page_imports_is_shipped() {
        // An import of a file left out of ASSETS would be a 404 in the browser only.
        for asset in ASSETS.iter().filter(|asset| asset.name.ends_with(".js")) {
            let source = std::str::from_utf8(asset.body).unwrap();
            for piece in source.split("from './").skip(1) {
                let name = piece.split('\'').next().unwrap();
                assert!(
                    ASSETS.iter().any(|shipped| shipped.name == name),
                    "{} imports {name}, which is not in ASSETS",
                    asset.name
                );
            }
        }
    }
}
