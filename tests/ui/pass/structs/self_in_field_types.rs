//! `Self` in owned and unowned field types (also of a generic struct): the generated init and
//! view structs reuse the field types with `Self` replaced by the struct's type.

#[kvown::guarded]
#[derive(Debug, Clone, Default)]
pub struct Node<T> {
    #[owned_by(grow)]
    parent: Option<Box<Self>>,
    children: Vec<Self>,
    tag: T,
}

#[kvown::owner]
pub fn grow<T: Clone>(node: &mut Node<T>) {
    let parent = node.clone();
    node.set_parent(owner, Some(Box::new(parent)));
}

fn main() {
    let mut node = Node::from(NodeInit {
        parent: None,
        children: vec![Node::default()],
        tag: 1u8,
    });
    node.fields_mut().children.push(Node::default());
    grow(&mut node);
    assert_eq!(node.parent().as_ref().map(|p| p.children.len()), Some(2));
    let init: NodeInit<u8> = node.into_init();
    assert_eq!(init.children.len(), 2);
}
